"""Fail and release: an executor gives a lease back, failed (with its error, retryable or not) or
untouched. The SQL decides what becomes of the subtask (another attempt, a failed subtask, the task's
end); here the failure's text is made safe to show and each verdict answered."""

from __future__ import annotations

from collections.abc import Sequence

from minions import protocol
from minions.logging import get_logger
from minions.nul import without_nul
from minions.redaction import redact_failure
from minions.services.api.context import Context
from minions.services.api.leasing import leases
from minions.services.api.leasing.leases import Lease

log = get_logger(__name__)


def error_text(failure: protocol.Failure, lease: Lease) -> str:
    """The failure's text as it is stored: the executor's, shown to the task's team in /subtasks and
    results, so secrets in it (any lease's token, a signed URL, an API token) are redacted before it
    is stored, logged or shown."""
    text = failure.error[:protocol.MAX_ERROR_CHARS]
    return str(without_nul(redact_failure(text, known=(str(lease.token), lease.raw))))


async def fail(ctx: Context, lease: Lease, failure: protocol.Failure) -> None:
    error = error_text(failure, lease)
    verdict = await ctx.gateway.fail(lease_token=lease.token, error=error, retryable=failure.retryable)
    settle_failure(ctx, lease, verdict, error, failure.retryable)


async def fail_batch(ctx: Context, ready: Sequence[tuple[Lease, protocol.LeaseFailure]]) -> list[tuple[str, str]]:
    """Many failures in one statement, in lock order: each one's (verdict, stored error)."""
    errors = [error_text(item, lease) for lease, item in ready]
    rows = await ctx.gateway.fail_batch(lease_tokens=[lease.token for lease, _ in ready], errors=errors,
                                        retryable=[item.retryable for _, item in ready])
    return [(row["verdict"], error) for row, error in zip(rows, errors, strict=True)]


def settle_failure(ctx: Context, lease: Lease, verdict: str, error: str, retryable: bool) -> None:
    ctx.leases.forget(lease.token)
    leases.answer(verdict)
    log.info("lease_failed", subtask=lease.subtask(), error=error[:200], retryable=retryable)


async def release(ctx: Context, lease: Lease) -> None:
    ctx.leases.forget(lease.token)
    leases.answer(await ctx.gateway.release(lease_token=lease.token))


async def release_batch(ctx: Context, ready: Sequence[Lease]) -> list[str]:
    """Many releases in one statement, in lock order: their verdicts."""
    rows = await ctx.gateway.release_batch(lease_tokens=[lease.token for lease in ready])
    return [row["verdict"] for row in rows]


def settle_release(ctx: Context, lease: Lease, verdict: str) -> None:
    ctx.leases.forget(lease.token)
    leases.answer(verdict)
