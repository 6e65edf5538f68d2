"""Executors over HTTP: register, deregister, the executor list, and an admin's release of a
quarantine. (An executor's claim and heartbeat are the lease protocol's: leasing/routes.py.)"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from minions import protocol
from minions.logging import get_logger
from minions.names import NAME
from minions.services.api.context import Context
from minions.services.api.executors import registration
from minions.services.api.gateway import ExecutorListRow, ExecutorOwnerRow
from minions.services.api.http.auth import require
from minions.services.api.http.bodies import json_object, path_uuid
from minions.services.api.http.errors import conflict, forbidden, invalid, not_found
from minions.services.api.http.responses import json_response

log = get_logger(__name__)
routes = web.RouteTableDef()


@routes.post("/api/v1/executors/register")
async def register(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    body = await json_object(request, limit=registration.MAX_REGISTRATION_BYTES)
    registered = await registration.register(Context.of(request), principal, body)
    return json_response(protocol.to_builtins(registered), 201)


async def _own_executor(request: web.Request) -> ExecutorOwnerRow:
    principal = require(request, "executor")
    executor_id = path_uuid(request, "executor_id", "executor")
    row = await Context.of(request).gateway.executor_owner(executor_id=executor_id)
    if row is None:
        raise not_found(f"executor {executor_id}")
    if principal.role != "admin" and row["token_id"] != principal.token_id:
        raise forbidden("this executor was registered with another token", "not_your_executor")
    return row


@routes.post("/api/v1/executors/{executor_id}/deregister")
async def deregister(request: web.Request) -> web.Response:
    executor = await _own_executor(request)
    released = await Context.of(request).gateway.deregister(executor_id=executor["id"])
    log.info("executor_deregistered", executor_id=str(executor["id"]), released=released)
    return json_response(protocol.to_builtins(protocol.Deregistered(status="offline", released=released)))


@routes.get("/api/v1/executors")
async def list_executors(request: web.Request) -> web.Response:
    principal = require(request, "user")
    team = request.query.get("team") or principal.team
    if team is not None and not NAME.match(team):
        raise invalid({"team": "not a valid name"})
    if principal.role != "admin" and principal.team is not None and team != principal.team:
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    # What a team sees of an executor outside it (a shared one) is narrowed in the query: no hardware,
    # none of other teams' preferences or work. Admins (and all-team tokens) see everything.
    scope = None if principal.role == "admin" else principal.team
    rows = await Context.of(request).gateway.list_executors(team=team, viewer_team=scope)
    return json_response({"executors": [_executor_json(r) for r in rows]})


def _executor_json(r: ExecutorListRow) -> dict[str, Any]:
    return {
        "id": str(r["id"]), "name": r["name"], "team": r["team"], "status": r["status"],
        "hardware": r["hardware"], "details_hidden": r["details_hidden"], "kinds": r["kinds"],
        "models": r["models"],
        "preferences": r["preferences"], "current": r["current"],
        "fingerprints": sorted(r["fingerprints"], key=lambda f: f["model"]),
        "trust": {"agreements": r["agreements"], "disagreements": r["disagreements"], "trusted": r["trusted"],
                  "vouched": r["vouched"], "owner": r["owner"],
                  "quarantined_at": r["quarantined_at"].isoformat() if r["quarantined_at"] else None,
                  "quarantine_reason": r["quarantine_reason"]},
        "registered_at": r["registered_at"].isoformat(),
        "last_heartbeat_at": r["last_heartbeat_at"].isoformat() if r["last_heartbeat_at"] else None,
    }


@routes.post("/api/v1/executors/{executor_id}/release")
async def release_quarantine(request: web.Request) -> web.Response:
    """An admin lifts a quarantine (sql/schema/11_checks.sql): the executor claims again, its results
    checked until it earns trust again."""
    require(request, "admin")
    executor_id = path_uuid(request, "executor_id", "executor")
    released = await Context.of(request).gateway.release_quarantine(executor_id=executor_id)
    if not released:
        raise conflict("not_quarantined", f"executor {executor_id} is not quarantined (or does not exist)")
    log.info("executor_quarantine_released", executor_id=str(executor_id))
    return json_response({"executor_id": str(executor_id), "quarantined": False})
