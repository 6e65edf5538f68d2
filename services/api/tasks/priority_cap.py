"""A user's task priority is held to its team's cap (team_shares.priority_cap, default 0); an admin
sets any. The database judges it (minion_priority_within_cap, sql/schema/14_teams.sql), inside the
statement that submits the task; this turns its refusal into the API's 403 `priority_above_cap`. The
same function refuses a user's submission to a team nothing names yet (only an admin makes a team):
the 403 `unknown_team`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import ApiError, forbidden

REFUSAL = "priority_above_cap"  # the database's message, and the API's error code
UNKNOWN_TEAM = "unknown_team"  # a user's submission to a team nothing names yet (only an admin makes one)


def capped(principal: Principal) -> bool:
    """Whether `principal`'s submissions are held to the cap of the task's team: every user's,
    scoped to a team or not (an unscoped user is held to the cap of whichever team it submits to)."""
    return principal.role != "admin"


def above_cap(team: str, priority: int, cap: int) -> ApiError:
    return forbidden(f"priority {priority} is above team {team}'s priority cap of {cap}: a user of the team may "
                     f"set at most {cap} (an admin sets any priority, and the cap with "
                     "`minions team set-priority-cap`)", REFUSAL)


@contextmanager
def refused_above_cap(team: str, priority: int) -> Iterator[None]:
    """The database's priority_above_cap raised inside this block, as the API's 403."""
    try:
        yield
    except asyncpg.InsufficientPrivilegeError as exc:
        if exc.message == UNKNOWN_TEAM:
            raise forbidden(f"team {team} does not exist: only an admin makes a team (a token scoped to it, "
                            "`minions token create --role user --team TEAM`, or a task of its own)",
                            UNKNOWN_TEAM) from None
        if exc.message != REFUSAL:
            raise
        raise above_cap(team, priority, int(exc.detail or 0)) from None
