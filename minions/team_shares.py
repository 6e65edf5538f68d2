"""A team's share of the common pool, as an admin sets it (team_shares, sql/schema/14_teams.sql):
the rule each value follows, checked the same way by the API (`PATCH /api/v1/teams/{team}`) and by
`minions team set-…` before it sends anything. The table's CHECK constraints hold the same bounds."""

from __future__ import annotations

import math
from typing import TypeGuard

MAX_WEIGHT = 1_000_000.0
MIN_PRIORITY_CAP, MAX_PRIORITY_CAP = -1000, 1000  # a task's priority range
MAX_LEASES = 2**31 - 1  # the column's integer
FIELDS = ("weight", "priority_cap", "max_leases")
RULES = {
    "weight": f"a number above 0 and at most {MAX_WEIGHT:,.0f} (the team's share of claims; default 1)",
    "priority_cap": f"an integer from {MIN_PRIORITY_CAP} to {MAX_PRIORITY_CAP} (the highest priority the team's "
                    "users may set; default 0)",
    "max_leases": f"an integer from 0 (no cap) to {MAX_LEASES} (leases the team may hold at once)",
}


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def share_problem(field: str, value: object) -> str | None:
    """The rule `value` breaks as the team's `field` (one of FIELDS), or None when it keeps it."""
    if field == "weight":
        ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
              and 0 < value <= MAX_WEIGHT)
    elif field == "priority_cap":
        ok = _is_int(value) and MIN_PRIORITY_CAP <= value <= MAX_PRIORITY_CAP
    else:
        ok = _is_int(value) and 0 <= value <= MAX_LEASES
    return None if ok else RULES[field]
