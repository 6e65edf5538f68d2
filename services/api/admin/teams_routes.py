"""Teams' shares of the common pool (sql/schema/14_teams.sql): each known team's weight, priority cap
and lease cap, listed for any user and set by an admin (`minions team set-weight|set-priority-cap|
set-max-leases|shares`). A team is known once a token, task or executor names it: a typo in a
request makes no team."""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp import web

from minions.logging import get_logger
from minions.names import is_name
from minions.services.api.appkeys import GATEWAY
from minions.services.api.http.auth import require
from minions.services.api.http.bodies import json_object
from minions.services.api.http.errors import ApiError, invalid
from minions.services.api.http.responses import iso, json_response
from minions.team_shares import FIELDS, share_problem

log = get_logger(__name__)
routes = web.RouteTableDef()
MAX_BODY_BYTES = 4096  # three numbers


def share_json(row: Any) -> dict[str, Any]:
    return {"team": row["team"], "weight": row["weight"], "priority_cap": row["priority_cap"],
            "max_leases": row["max_leases"], "updated_at": iso(row["updated_at"])}


@routes.get("/api/v1/teams")
async def list_teams(request: web.Request) -> web.Response:
    """An admin, or a user scoped to no team (who may submit to any), sees every known team; a
    team's user sees its own."""
    principal = require(request, "user")
    only = principal.team if principal.role != "admin" else None
    rows = await request.app[GATEWAY].team_shares(team=only)
    return json_response({"teams": [share_json(r) for r in rows]})


def _change(body: dict[str, Any]) -> tuple[float | None, int | None, int | None]:
    """The values to set (None: keep), each one present checked against its rule (null breaks it)."""
    errors = {key: f"unknown field: one of {', '.join(FIELDS)}" for key in sorted(set(body) - set(FIELDS))}
    for field in FIELDS:
        if field in body and (problem := share_problem(field, body[field])) is not None:
            errors[field] = problem
    if not body:
        errors["body"] = f"give at least one of {', '.join(FIELDS)}"
    if errors:
        raise invalid(errors, "invalid values: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    weight = body.get("weight")
    return None if weight is None else float(weight), body.get("priority_cap"), body.get("max_leases")


@routes.patch("/api/v1/teams/{team}")
async def set_team_share(request: web.Request) -> web.Response:
    principal = require(request, "admin")
    team = request.match_info["team"]
    weight, priority_cap, max_leases = _change(await json_object(request, limit=MAX_BODY_BYTES))
    row = None
    if is_name(team):  # no other name can be known
        try:
            row = await request.app[GATEWAY].set_team_share(team=team, weight=weight, priority_cap=priority_cap,
                                                            max_leases=max_leases)
        except asyncpg.CheckViolationError as exc:  # the bounds above are the table's: only a drift lands here
            raise invalid({"team_shares": f"out of bounds ({exc.constraint_name})"}) from None
    if row is None:
        raise ApiError(422, "unknown_team", f"no token, task or executor names team {team!r}: create a token "
                                            "for it first (a typo must not make a team)")
    log.info("team_share_set", team=team, weight=row["weight"], priority_cap=row["priority_cap"],
             max_leases=row["max_leases"], by_token_id=principal.token_id)
    return json_response(share_json(row))
