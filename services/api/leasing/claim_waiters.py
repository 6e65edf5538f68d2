"""Long-poll claims wait here, woken by NOTIFY on the `subtasks` channel.

One LISTEN connection per API process (minions/db/listen.py), however many executors wait: an idle
system runs no polling queries. A waiter registers *before* it runs its claim query, so a
notification that lands during the query is not missed. When the LISTEN connection drops, and
again once it is back, every waiter is woken: it re-queries, so nothing notified meanwhile is missed.

Other channels of the API ride on the same connection (`ChannelListener`): the token cache hears of
revoked tokens on `tokens`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Protocol

from minions.db.listen import Listener

CHANNEL = "subtasks"


class ChannelListener(Protocol):
    """Something else in the API process that LISTENs on `channel` through this connection."""

    channel: str

    def notified(self, payload: str) -> None: ...

    def listening_changed(self, listening: bool) -> None:
        """True once LISTEN is in place; False when the connection is lost (notifications may be
        missed until the next True)."""


class Waiter:
    __slots__ = ("capabilities", "event")

    def __init__(self, capabilities: frozenset[str] | None) -> None:
        # None: woken by any notification (what the executor serves is not known yet).
        self.capabilities = capabilities
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """True when woken, False at the timeout. Clears the wake-up for the next round."""
        try:
            # asyncio.timeout, not wait_for: no task of its own to hop through (Python 3.11's wait_for
            # wraps the wait in one), so a woken claim runs its query an iteration or two sooner.
            async with asyncio.timeout(timeout):
                await self.event.wait()
        except TimeoutError:
            return False
        self.event.clear()
        return True


class ClaimWaiters:
    def __init__(self, database_url: str, *, probe_interval_s: float,
                 listeners: Sequence[ChannelListener] = ()) -> None:
        self._waiters: set[Waiter] = set()
        self._listeners = tuple(listeners)
        self._listener = Listener(database_url, CHANNEL, self._on_notify, catch_up=self._listening,
                                  on_lost=self._lost, probe_interval_s=probe_interval_s,
                                  also={each.channel: each.notified for each in self._listeners})
        self._task: asyncio.Task[None] | None = None
        self.closing = False

    @property
    def connected(self) -> asyncio.Event:
        return self._listener.connected

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listener.run(), name="claim-waiters-listen")
        # Serve even while the database is down; the listener catches up when it returns.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), 5)

    def close(self) -> None:
        """The process is shutting down: every waiting claim is woken and, seeing `closing`, answers
        204 at once. Otherwise the server's graceful shutdown would wait for each open long-poll to
        time out (up to its shutdown timeout) before the process could exit; the executor's next
        claim reaches a replica that is still serving."""
        self.closing = True
        self._wake_all()

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._lost()

    @contextlib.contextmanager
    def registered(self, capabilities: frozenset[str] | None = None) -> Iterator[Waiter]:
        waiter = Waiter(capabilities)
        self._waiters.add(waiter)
        try:
            yield waiter
        finally:
            self._waiters.discard(waiter)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def wake(self, capability: str) -> None:
        """Wakes the claims that wait for `capability` (or for anything): what a NOTIFY on
        `subtasks` does, called directly by a submission that made subtasks in this process."""
        for waiter in self._waiters:
            if waiter.capabilities is None or capability in waiter.capabilities:
                waiter.event.set()

    def _on_notify(self, payload: str) -> None:
        self.wake(payload)

    def _listening(self) -> None:
        for listener in self._listeners:
            listener.listening_changed(True)
        self._wake_all()  # anything notified while we were away: let waiters look again

    def _lost(self) -> None:
        for listener in self._listeners:
            listener.listening_changed(False)
        self._wake_all()

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            waiter.event.set()
