"""Long-poll claims wait here, woken by NOTIFY on the `subtasks` channel.

One LISTEN connection per API process, however many executors wait: an idle system runs no polling
queries. A waiter registers *before* it runs its claim query, so a notification that lands during
the query is not missed. When the LISTEN connection drops, every waiter is woken (it re-queries, so
nothing notified meanwhile is missed) and the connection is re-established with backoff.

Other channels of the API ride on the same connection (`ChannelListener`): the token cache hears of
revoked tokens on `tokens`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import asyncpg

from minions.backoff import Backoff
from minions.db.connect import CONNECTION_ERRORS, connect
from minions.logging import get_logger

log = get_logger(__name__)
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

    def __init__(self, capabilities: frozenset[str]) -> None:
        self.capabilities = capabilities
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> bool:
        """True when woken, False at the timeout. Clears the wake-up for the next round."""
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except TimeoutError:
            return False
        self.event.clear()
        return True


def _setter(event: asyncio.Event) -> Any:
    return lambda _conn: event.set()


def _forward(listener: ChannelListener) -> Any:
    return lambda _conn, _pid, _channel, payload: listener.notified(payload)


class ClaimWaiters:
    def __init__(self, database_url: str, listeners: Sequence[ChannelListener] = ()) -> None:
        self._url = database_url
        self._listeners = tuple(listeners)
        self._waiters: set[Waiter] = set()
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._keep_listening(), name="claim-waiters-listen")
        # Serve even while the database is down; the listener catches up when it returns.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.connected.wait(), 5)

    async def stop(self) -> None:
        self._stopping = True
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
        self._listening_changed(False)
        self._wake_all()

    @contextlib.contextmanager
    def registered(self, capabilities: frozenset[str]) -> Iterator[Waiter]:
        waiter = Waiter(capabilities)
        self._waiters.add(waiter)
        try:
            yield waiter
        finally:
            self._waiters.discard(waiter)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        for waiter in self._waiters:
            if payload in waiter.capabilities:
                waiter.event.set()

    def _listening_changed(self, listening: bool) -> None:
        for listener in self._listeners:
            listener.listening_changed(listening)

    def _wake_all(self) -> None:
        for waiter in self._waiters:
            waiter.event.set()

    async def _keep_listening(self) -> None:
        backoff = Backoff(max_s=5.0)
        while not self._stopping:
            lost = asyncio.Event()
            try:
                conn = await connect(self._url)
                conn.add_termination_listener(_setter(lost))
                await conn.add_listener(CHANNEL, self._on_notify)
                for listener in self._listeners:
                    await conn.add_listener(listener.channel, _forward(listener))
                self._conn = conn
                self.connected.set()
                self._listening_changed(True)
                self._wake_all()  # anything notified while we were away: let waiters look again
                log.info("listening", channel=CHANNEL)
                backoff.reset()
                await self._watch(conn, lost)
            except asyncio.CancelledError:
                raise
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                log.warning("listen_connection_failed", error=str(exc))
            self.connected.clear()
            self._listening_changed(False)
            self._wake_all()
            await backoff.sleep()

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Return when the connection is gone. A liveness probe every 30 s catches a server that
        vanished without closing the socket (termination listeners do not fire then); it is one
        trivial statement, not a poll for work."""
        while not lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), 30)
            if lost.is_set():
                break
            try:
                await conn.execute("SELECT 1", timeout=5)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError):
                break
        with contextlib.suppress(Exception):
            conn.terminate()
