"""One LISTEN connection kept alive: connect, LISTEN, catch up, watch; on any loss, back off and repeat.

Every user (the API's claim waiters, the splitter, the watchdog) treats a notification as a
wake-up, never as the only record of work: the database is re-read. So a notification sent while
the connection was down costs latency, not work, provided the user looks again once it is back:
each (re)LISTEN calls `catch_up`.

A closed socket fires asyncpg's termination listener at once. A server that vanished without
closing it (a dropped network path, a frozen host) fires nothing, and an idle LISTEN connection
would wait forever: a probe every `probe_interval_s` (MINIONS_LISTEN_PROBE_S) notices it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import asyncpg

from minions.backoff import Backoff
from minions.db.connect import CONNECTION_ERRORS, connect
from minions.db.gateways.listen import ListenGateway
from minions.logging import get_logger

log = get_logger(__name__)
PROBE_TIMEOUT_S = 5.0


def application_name(channel: str) -> str:
    """What the LISTEN connection on `channel` is called in pg_stat_activity (for operators and tests)."""
    return f"minions-listen-{channel}"


class Listener:
    """`await listener.run()` until cancelled. `on_notify(payload)` runs for each notification,
    `catch_up()` after each (re)LISTEN, `on_lost()` (optional) when the connection is gone. All
    three are plain callables, run on the event loop: they should only set events. `also` maps
    further channels to their handlers, heard on the same connection (one per process, however many
    channels)."""

    def __init__(self, database_url: str, channel: str, on_notify: Callable[[str], None], *,
                 catch_up: Callable[[], None], probe_interval_s: float,
                 on_lost: Callable[[], None] | None = None,
                 also: Mapping[str, Callable[[str], None]] | None = None) -> None:
        self.database_url = database_url
        self.channel = channel
        self._also = dict(also or {})
        self.probe_interval_s = probe_interval_s
        self._on_notify = on_notify
        self._catch_up = catch_up
        self._on_lost = on_lost
        self.connected = asyncio.Event()
        self.listens = 0  # LISTENs established so far: 1 + reconnects

    async def run(self) -> None:
        backoff = Backoff(max_s=5.0)
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect(self.database_url,
                                     server_settings={"application_name": application_name(self.channel)})
                await self._listen(conn, backoff)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                log.warning("listen_connection_failed", channel=self.channel, error=repr(exc))
            except Exception:
                # Whatever it was, a fresh connection is the cure; the users sweep meanwhile.
                log.exception("listen_failed", channel=self.channel)
            finally:
                self.connected.clear()
                if conn is not None:
                    conn.terminate()
            if self._on_lost is not None:
                self._on_lost()
            await backoff.sleep()

    async def _listen(self, conn: asyncpg.Connection, backoff: Backoff) -> None:
        """Returns once the connection is gone, seen closed or failing the probe."""
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())
        await conn.add_listener(self.channel, self._deliver)
        for channel, handler in self._also.items():
            await conn.add_listener(channel, _forward(handler))
        self.listens += 1
        self.connected.set()
        log.info("listening", channel=self.channel, reconnect=self.listens > 1)
        backoff.reset()
        self._catch_up()  # whatever was notified while we were not listening
        await self._watch(conn, lost)

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        db = ListenGateway(conn)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), self.probe_interval_s)
            if lost.is_set():
                log.warning("listen_connection_lost", channel=self.channel)
                return
            try:
                await db.probe(timeout=min(self.probe_interval_s, PROBE_TIMEOUT_S))
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                log.warning("listen_probe_failed", channel=self.channel, error=repr(exc))
                return

    def _deliver(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self._on_notify(payload)


def _forward(handler: Callable[[str], None]) -> Callable[[Any, int, str, str], None]:
    return lambda _conn, _pid, _channel, payload: handler(payload)
