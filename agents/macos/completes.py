"""The agent's completes, gathered by a CommitBuffer into batched requests.

One complete is in flight at a time; those that come meanwhile wait and then go together in one
`POST /api/v1/leases/complete`, each lease with its own outcome, exactly as its own request's; a
lone one goes as its own `POST /api/v1/leases/{token}/complete`. A complete lingers up to
COMMIT_LINGER_S for others only while more are on their way (leases still at work).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from minions.agents.macos.client import Conflict, ExecutorClient, Rejected
from minions.agents.macos.commit_buffer import CommitBuffer
from minions.protocol import MAX_TOKENS, LeaseCompletion

# A complete waits this long (at most) for others while more are on their way: one request for
# several on a fast device. Small beside any lease, and beside a slow subtask.
COMMIT_LINGER_S = 0.02
COMMIT_LINGER_COUNT = 8  # ... or until this many wait


@dataclass
class PendingComplete:
    """A complete waiting for its turn: one lease, its outcome to come (None: committed)."""

    token: str
    records: int
    seconds: float
    output: bytes | None
    outcome: asyncio.Future[Rejected | None]


class Completes:
    def __init__(self, client: ExecutorClient, more_expected: Callable[[], bool]) -> None:
        """`more_expected`: whether leases still at work may add a complete soon (then a complete
        lingers for them)."""
        self._client = client
        self._buffer: CommitBuffer[PendingComplete] = CommitBuffer(
            self._send, size=COMMIT_LINGER_COUNT, linger_s=COMMIT_LINGER_S, most=MAX_TOKENS,
            more_expected=more_expected)

    async def complete(self, token: str, records: int, seconds: float, output: bytes | None) -> None:
        """Commit one lease; raises as its own request would (Conflict, Rejected, AuthError).
        Cancelled before it was sent, it is never sent."""
        pending = PendingComplete(token, records, seconds, output, asyncio.get_running_loop().create_future())
        self._buffer.add(pending)
        refused = await pending.outcome
        if refused is not None:
            raise refused

    async def close(self, timeout_s: float) -> None:
        """Send what waits and let the request in flight finish, for `timeout_s` at most; a
        complete never sent is cancelled (its job hears it as a request cut short)."""
        for never_sent in await self._buffer.close(timeout_s):
            never_sent.outcome.cancel()

    async def _send(self, batch: list[PendingComplete]) -> None:
        """One request for the batch; every lease in it hears its outcome, or the request's error."""
        waiting = [c for c in batch if not c.outcome.done()]  # done: its job was cancelled meanwhile
        if not waiting:
            return
        try:
            outcomes = await self._request(waiting)
        except Exception as exc:  # AuthError, a malformed answer: every lease of the request hears it
            for c in waiting:
                if not c.outcome.done():
                    c.outcome.set_exception(exc)
            return
        for c in waiting:
            if not c.outcome.done():
                missing = Conflict(409, "lease_lost", "the answer had no outcome for this lease")
                c.outcome.set_result(outcomes.get(c.token, missing))

    async def _request(self, batch: list[PendingComplete]) -> dict[str, Rejected | None]:
        if len(batch) == 1:
            one = batch[0]
            try:
                await self._client.complete(one.token, one.records, one.seconds, one.output)
            except Rejected as exc:
                return {one.token: exc}
            return {one.token: None}
        return await self._client.complete_batch([
            LeaseCompletion(token=c.token, records=c.records, seconds=round(c.seconds, 3),
                            output=None if c.output is None else c.output.decode())
            for c in batch])
