"""The usage account: compute-seconds and records of ended attempts, charged to the team whose task
each ran and credited to the executor (and its owner) that ran it (sql/schema/16_usage.sql). A team's
token sees its own team only; an admin's (or an all-teams token's) every team."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from minions.names import NAME
from minions.services.api.appkeys import GATEWAY
from minions.services.api.http.auth import require
from minions.services.api.http.errors import forbidden, invalid
from minions.services.api.http.responses import iso, json_response
from minions.usage import BY_RULE, DEFAULT_SINCE, SINCE_RULE, USAGE_BY, since_s

routes = web.RouteTableDef()
SECONDS = ("used_s", "verification_s", "lost_s")
COUNTS = ("records", "attempts")


def _row(r: Any) -> dict[str, Any]:
    return {"team": r["team"], "executor_id": str(r["executor_id"]) if r["executor_id"] else None,
            "executor": r["executor"], "owner": r["owner"],
            **{k: float(r[k]) for k in SECONDS}, **{k: int(r[k]) for k in COUNTS}}


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {**{k: sum(r[k] for r in rows) for k in SECONDS}, **{k: sum(r[k] for r in rows) for k in COUNTS}}


@routes.get("/api/v1/usage")
async def usage(request: web.Request) -> web.Response:
    principal = require(request, "user")
    errors: dict[str, str] = {}
    since_text = request.query.get("since") or DEFAULT_SINCE
    window_s = since_s(since_text)
    if window_s is None:
        errors["since"] = SINCE_RULE
    by = request.query.get("by") or "team"
    if by not in USAGE_BY:
        errors["by"] = BY_RULE
    team = request.query.get("team") or principal.team
    if team is not None and not NAME.match(team):
        errors["team"] = "not a valid name"
    if errors:
        raise invalid(errors)
    if team is not None and not principal.can_see_team(team):
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    since = datetime.now(UTC) - timedelta(seconds=window_s or 0)
    rows = [_row(r) for r in await request.app[GATEWAY].usage(since=since, team=team, by=by)]
    return json_response({"since": iso(since), "team": team, "by": by, "usage": rows, "totals": _totals(rows)})
