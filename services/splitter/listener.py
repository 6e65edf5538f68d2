"""LISTEN on channel `tasks` on a dedicated connection and wake the workers.

A notification is only a wake-up: the workers then sweep for unsplit tasks, so a notification lost
while this connection was down costs nothing but latency. That is also why every (re)connect wakes
the workers once.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from minions.backoff import Backoff
from minions.db.connect import CONNECTION_ERRORS, connect
from minions.db.queries import Queries
from minions.logging import get_logger

Q = Queries("splitter")
CHANNEL = "tasks"


class Wakeup:
    """Wakes every worker: each waits on its own event and clears it before it sweeps, so a wake-up
    that arrives during a sweep leads to one more sweep, never to none."""

    def __init__(self) -> None:
        self._events: list[asyncio.Event] = []

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        event.set()  # sweep once at start
        self._events.append(event)
        return event

    def set(self) -> None:
        for event in self._events:
            event.set()


class TaskListener:
    def __init__(self, database_url: str, wakeup: Wakeup, *, ping_interval_s: float) -> None:
        self.database_url = database_url
        self.wakeup = wakeup
        # An idle LISTEN connection would not notice a silently dropped network path; a ping on
        # this period does, and a reconnect follows.
        self.ping_interval_s = ping_interval_s
        self.log = get_logger("splitter.listener")

    async def run(self) -> None:
        """Until cancelled: connect, LISTEN, wake the workers; on any loss, back off and repeat."""
        backoff = Backoff()
        while True:
            try:
                conn = await connect(self.database_url)
            except Exception as exc:  # unreachable, starting up, wrong password: all may pass
                self.log.warning("listener_unreachable", error=repr(exc))
                await backoff.sleep()
                continue
            try:
                await self._listen(conn)
                backoff.reset()  # _listen returns once the connection is gone
            except CONNECTION_ERRORS as exc:
                self.log.warning("listener_connection_lost", error=repr(exc))
            except Exception:
                # Whatever it was, a fresh connection is the cure; the workers sweep meanwhile.
                self.log.exception("listener_failed")
            finally:
                conn.terminate()
            await backoff.sleep()

    async def _listen(self, conn: asyncpg.Connection) -> None:
        lost = asyncio.get_running_loop().create_future()

        def on_lost(_: Any) -> None:
            if not lost.done():
                lost.set_result(None)

        conn.add_termination_listener(on_lost)
        await conn.add_listener(CHANNEL, self._on_notify)
        self.log.info("listening", channel=CHANNEL)
        # Whatever was notified while we were not listening is found by this sweep.
        self.wakeup.set()
        while not lost.done():
            await asyncio.wait([lost], timeout=self.ping_interval_s)
            if not lost.done():
                await asyncio.wait_for(conn.fetchval(Q.ping), timeout=min(self.ping_interval_s, 10.0))
        self.log.warning("listener_connection_closed")

    def _on_notify(self, _conn: Any, _pid: int, _channel: str, _payload: str) -> None:
        self.wakeup.set()
