"""The lease a request names, and what the SQL's verdicts on it mean to the executor.

The lease token fences every step: a token that is no longer current gets 409 and changes nothing, so
a result is committed exactly once. What is known of a lease comes from its claim when this process
handed it out (lease_facts.py), else from minion_lease_info; whether it is still current is never
taken from here: the SQL functions decide."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minions.services.api.context import Context
from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import ApiError, conflict, forbidden, invalid, not_found

REFUSED = {
    "lost": ("lease_lost", "this lease is no longer current (reclaimed, released or already finished)"),
    "cancelled": ("task_cancelled", "the task was cancelled; drop this work"),
    "records_mismatch": ("records_mismatch", "records does not match the subtask's record count"),
}
# A complete that counts though it commits nothing yet, or commits another's result (sql/schema/11_checks.sql): a
# result held for its check, or a replica's vote. The executor is answered as for any complete.
CHECKED = ("held", "agreed", "settled", "disputed", "no_quorum")


@dataclass
class Lease:
    """One lease a request acts on: its token as sent, as a UUID, and what is known of it while it is
    current (a minion_lease_info row, or the claim's facts), None once it is not."""

    raw: str
    token: uuid.UUID
    live: Mapping[str, Any] | None
    cached: bool

    def lock_key(self) -> tuple[int, int, str]:
        """By (task, subtask): two batches then lock subtask and task rows in the same order."""
        live = self.live
        return (live["task_id"], live["subtask_id"], self.raw) if live is not None else (0, 0, self.raw)

    def subtask(self) -> str | None:
        """`task/subtask`, for logs: a lease is named by its subtask, never by its token."""
        return f"{self.live['task_id']}/{self.live['subtask_id']}" if self.live is not None else None


async def find(ctx: Context, principal: Principal, raw: str, *, to_complete: bool = False) -> Lease:
    """The lease `raw` names, held by one of the caller's executors (an admin may act on any).
    `to_complete`: looked up with its kept input's range, which the complete's check reads."""
    try:
        token = uuid.UUID(raw)
    except ValueError:
        raise conflict(*REFUSED["lost"]) from None
    live: Mapping[str, Any] | None = ctx.leases.get(token)
    cached = live is not None
    if live is None:
        live = await ctx.gateway.lease_info(lease_token=token, with_kept_input=to_complete)
    if live is not None and principal.role != "admin" and live["owner"] != principal.token_id:
        raise forbidden("this lease is held by an executor of another token", "not_your_lease")
    return Lease(raw, token, live, cached)


async def still_live(ctx: Context, lease: Lease) -> bool:
    """Whether a lease known from its claim is still current (asked only when a check failed, so that a
    stale lease is refused as stale, not for what its output holds)."""
    return not lease.cached or await ctx.gateway.lease_info(lease_token=lease.token) is not None


def answer(verdict: str) -> None:
    """Nothing for a verdict that counts; the executor's error for one that does not."""
    if verdict in ("ok", "repeat") or verdict in CHECKED:
        return
    code, message = REFUSED[verdict]
    if verdict == "records_mismatch":
        raise invalid({"records": message})
    raise conflict(code, message)


def refuse_executor(verdict: str, executor_id: uuid.UUID) -> None:
    """The error a claim or heartbeat verdict other than a lease (or 'ok', 'empty') stands for."""
    if verdict == "not_found":
        raise not_found(f"executor {executor_id}")
    if verdict == "not_your_executor":
        raise forbidden("this executor was registered with another token", "not_your_executor")
    if verdict == "deregistered":
        raise ApiError(409, "deregistered", "this executor deregistered; register again to claim work")
