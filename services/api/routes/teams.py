"""Teams' shares of the common pool (sql/schema/14_teams.sql): each known team's weight, priority cap
and lease cap, listed for any user and set by an admin (`minions team set-weight|set-priority-cap|
set-max-leases|shares`). A team is known once a token, task or executor names it: a typo in a
request makes no team."""

from __future__ import annotations

import math
from typing import Any

import asyncpg
from aiohttp import web

from minions.db.queries import Queries
from minions.logging import get_logger
from minions.names import is_name
from minions.services.api.appkeys import POOL
from minions.services.api.auth import require
from minions.services.api.bodies import json_object
from minions.services.api.errors import ApiError, invalid
from minions.services.api.responses import iso, json_response

Q = Queries("api")
log = get_logger(__name__)
routes = web.RouteTableDef()
MAX_BODY_BYTES = 4096  # three numbers
# The bounds are team_shares' CHECK constraints, checked here first so that each is named by its rule.
MAX_WEIGHT = 1_000_000.0
PRIORITY_CAP_RANGE = (-1000, 1000)
MAX_LEASES = 2**31 - 1  # the column's integer
RULES = {
    "weight": f"a number above 0 and at most {MAX_WEIGHT:,.0f} (the team's share of claims; default 1)",
    "priority_cap": f"an integer from {PRIORITY_CAP_RANGE[0]} to {PRIORITY_CAP_RANGE[1]} (the highest priority "
                    "the team's users may set; default 0)",
    "max_leases": f"an integer from 0 (no cap) to {MAX_LEASES} (leases the team may hold at once)",
}


def share_json(row: Any) -> dict[str, Any]:
    return {"team": row["team"], "weight": row["weight"], "priority_cap": row["priority_cap"],
            "max_leases": row["max_leases"], "updated_at": iso(row["updated_at"])}


@routes.get("/api/v1/teams")
async def list_teams(request: web.Request) -> web.Response:
    """An admin, or a user scoped to no team (who may submit to any), sees every known team; a
    team's user sees its own."""
    principal = require(request, "user")
    only = principal.team if principal.role != "admin" else None
    rows = await request.app[POOL].fetch(Q.team_shares, only)
    return json_response({"teams": [share_json(r) for r in rows]})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _change(body: dict[str, Any]) -> tuple[float | None, int | None, int | None]:
    """The values to set (None: keep), each present one checked against its rule (null is none)."""
    errors = {key: "unknown field: one of weight, priority_cap, max_leases" for key in sorted(set(body) - set(RULES))}
    weight, priority_cap, max_leases = (body.get(key) for key in RULES)
    if "weight" in body and (isinstance(weight, bool) or not isinstance(weight, int | float)
                             or not math.isfinite(weight) or not 0 < weight <= MAX_WEIGHT):
        errors["weight"] = RULES["weight"]
    if "priority_cap" in body and (not _is_int(priority_cap)
                                   or not PRIORITY_CAP_RANGE[0] <= priority_cap <= PRIORITY_CAP_RANGE[1]):
        errors["priority_cap"] = RULES["priority_cap"]
    if "max_leases" in body and (not _is_int(max_leases) or not 0 <= max_leases <= MAX_LEASES):
        errors["max_leases"] = RULES["max_leases"]
    if not body:
        errors["body"] = "give at least one of weight, priority_cap, max_leases"
    if errors:
        raise invalid(errors, "invalid values: " + "; ".join(f"{k}: {v}" for k, v in errors.items()))
    return None if weight is None else float(weight), priority_cap, max_leases


@routes.patch("/api/v1/teams/{team}")
async def set_team_share(request: web.Request) -> web.Response:
    principal = require(request, "admin")
    team = request.match_info["team"]
    weight, priority_cap, max_leases = _change(await json_object(request, limit=MAX_BODY_BYTES))
    row = None
    if is_name(team):  # no other name can be known
        try:
            row = await request.app[POOL].fetchrow(Q.set_team_share, team, weight, priority_cap, max_leases)
        except asyncpg.CheckViolationError as exc:  # the bounds above are the table's: only a drift lands here
            raise invalid({"team_shares": f"out of bounds ({exc.constraint_name})"}) from None
    if row is None:
        raise ApiError(422, "unknown_team", f"no token, task or executor names team {team!r}: create a token "
                                            "for it first (a typo must not make a team)")
    log.info("team_share_set", team=team, weight=row["weight"], priority_cap=row["priority_cap"],
             max_leases=row["max_leases"], by_token_id=principal.token_id)
    return json_response(share_json(row))
