"""The one LISTEN helper (minions/db/listen.py) against a real PostgreSQL: a LISTEN connection that is
killed (pg_terminate_backend) or that goes silent (a network path that stops carrying bytes, which
only the liveness probe can notice) is replaced, LISTENs again and calls the catch-up callback; and
each of its three users (API, splitter, watchdog) LISTENs again after its connection is killed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import asyncpg
import yarl

from minions.db.connect import connect
from minions.db.listen import Listener, application_name
from minions.sdk import MinionsClient
from minions.testing.cluster import log_events
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually


@dataclass
class Heard:
    """What a Listener's callbacks saw."""

    payloads: list[str] = field(default_factory=list)
    catch_ups: int = 0
    losses: int = 0

    def listener(self, url: str, channel: str, probe_interval_s: float = 30.0) -> Listener:
        return Listener(url, channel, self.payloads.append, catch_up=self._catch_up, on_lost=self._lost,
                        probe_interval_s=probe_interval_s)

    def _catch_up(self) -> None:
        self.catch_ups += 1

    def _lost(self) -> None:
        self.losses += 1


@contextlib.asynccontextmanager
async def running(listener: Listener) -> AsyncIterator[None]:
    task = asyncio.create_task(listener.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def listen_pids(conn: asyncpg.Connection, channels: tuple[str, ...]) -> dict[str, int]:
    rows = await conn.fetch("SELECT application_name, pid FROM pg_stat_activity"
                            " WHERE datname = current_database() AND application_name = ANY($1::text[])",
                            [application_name(c) for c in channels])
    return {r["application_name"].removeprefix("minions-listen-"): r["pid"] for r in rows}


async def kill_listeners(conn: asyncpg.Connection, channels: tuple[str, ...]) -> dict[str, int]:
    """pg_terminate_backend on the LISTEN connection of each channel; returns the killed pids."""
    async def every_one() -> dict[str, int] | None:
        pids = await listen_pids(conn, channels)
        return pids if set(pids) == set(channels) else None

    pids = await eventually(every_one, "a LISTEN connection on each channel")
    await conn.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid", list(pids.values()))
    return pids


async def test_a_killed_listen_connection_is_replaced_and_catches_up(database_url: str) -> None:
    heard = Heard()
    listener = heard.listener(database_url, "listen_test")
    conn = await connect(database_url)
    try:
        async with running(listener):
            await asyncio.wait_for(listener.connected.wait(), 10)
            await conn.execute("SELECT pg_notify('listen_test', 'before')")
            await eventually(lambda: _true(heard.payloads == ["before"]), "the first notification")
            assert heard.catch_ups == 1

            killed = await kill_listeners(conn, ("listen_test",))
            await eventually(lambda: _true(listener.listens == 2), "a second LISTEN")
            now = await listen_pids(conn, ("listen_test",))
            assert now and now["listen_test"] != killed["listen_test"]
            assert heard.losses == 1 and heard.catch_ups == 2

            await conn.execute("SELECT pg_notify('listen_test', 'after')")
            await eventually(lambda: _true(heard.payloads == ["before", "after"]), "a notification after")
    finally:
        await conn.close()


class FreezableProxy:
    """A TCP proxy in front of PostgreSQL that can go silent on the connections it carries: bytes stop
    flowing both ways and no socket is closed, as when a network path drops. Connections opened
    after `freeze()` flow normally."""

    def __init__(self, upstream: yarl.URL) -> None:
        self.upstream = upstream
        self._frozen: list[asyncio.Event] = []
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> yarl.URL:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return self.upstream.with_port(port)

    def freeze(self) -> None:
        for frozen in self._frozen:
            frozen.set()

    async def close(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        for writer in self._writers:
            writer.close()
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.upstream.host is not None and self.upstream.port is not None
        up_reader, up_writer = await asyncio.open_connection(self.upstream.host, self.upstream.port)
        frozen = asyncio.Event()
        self._frozen.append(frozen)
        self._writers += [writer, up_writer]
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pump = asyncio.create_task(self._pump(source, sink, frozen))
            self._pumps.add(pump)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, frozen: asyncio.Event) -> None:
        while data := await source.read(65536):
            if frozen.is_set():
                await asyncio.Event().wait()  # swallow it, keep the socket open: silence
            sink.write(data)
            await sink.drain()


async def test_a_silent_listen_connection_is_noticed_by_the_probe(database_url: str) -> None:
    proxy = FreezableProxy(yarl.URL(database_url))
    heard = Heard()
    listener = heard.listener(str(await proxy.start()), "listen_test", probe_interval_s=0.5)
    conn = await connect(database_url)
    try:
        async with running(listener):
            await asyncio.wait_for(listener.connected.wait(), 10)
            before = await listen_pids(conn, ("listen_test",))
            proxy.freeze()
            # Nothing closed: only the probe (0.5 s period, timeout as long) can tell.
            await eventually(lambda: _true(listener.listens == 2), "a LISTEN on a fresh connection")
            assert heard.losses == 1 and heard.catch_ups == 2
            await eventually(lambda: _new_pid(conn, before), "the new LISTEN connection")
            await conn.execute("SELECT pg_notify('listen_test', 'after')")
            await eventually(lambda: _true("after" in heard.payloads), "a notification on the new connection")
    finally:
        await conn.close()
        await proxy.close()


async def _new_pid(conn: asyncpg.Connection, before: dict[str, int]) -> bool:
    # The frozen connection's backend is still there (nothing reached the server to close it), so
    # look for any other backend under the channel's name, not for the one pid a dict would keep.
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                            " AND application_name = $1", application_name("listen_test"))
    return any(r["pid"] != before["listen_test"] for r in rows)


async def _true(value: bool) -> bool:
    return value


async def test_each_service_listens_again_after_its_listen_connection_is_killed(services: Services) -> None:
    services.long_poll_s = 60.0  # a claim is answered only by a wake-up, not by its timeout
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    channels = {"api": "subtasks", "splitter": "tasks", "watchdog": "heartbeats"}
    conn = await connect(services.database_url)
    try:
        killed = await kill_listeners(conn, tuple(channels.values()))

        async def all_replaced() -> dict[str, int] | None:
            now = await listen_pids(conn, tuple(channels.values()))
            fresh = {c: pid for c, pid in now.items() if pid != killed[c]}
            return fresh if set(fresh) == set(channels.values()) else None

        await eventually(all_replaced, "every service to LISTEN on a new connection")
        for service in channels:
            # The new connection shows in pg_stat_activity before its LISTEN is done and logged.
            async def relistened(service: str = service) -> list[bool] | None:
                events = log_events(services.running[service].log(), "listening")
                seen = [e["reconnect"] for e in events]
                return seen if len(seen) >= 2 else None

            assert await eventually(relistened, f"{service} to log its second LISTEN") == [False, True]

        # The API's new LISTEN wakes a waiting claim when the splitter (on its new LISTEN) splits.
        executor = SleepExecutor(services.api_url, executor_token, "waiting")
        async with aiohttp.ClientSession() as session, MinionsClient(services.api_url, admin) as client:
            await executor.register(session)
            claim = asyncio.create_task(session.post(
                f"{services.api_url}/api/v1/executors/{executor.executor_id}/claim?wait=60",
                headers={"Authorization": f"Bearer {executor_token}"}))
            await asyncio.sleep(1.0)  # it has run its claim query, found nothing, and waits
            await client.submit({"team": "search", "project": "ranker", "name": "after-kill", "kind": "sleep",
                                 "input": {"records": [{"id": 1, "ms": 1}]}})
            async with await asyncio.wait_for(claim, 30) as resp:
                assert resp.status == 200, await resp.text()
    finally:
        await conn.close()

