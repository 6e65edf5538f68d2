"""A real API server for synchronous clients (schemathesis drives it with `requests`): the app, with
its OpenAPI route, runs on its own event loop in a background thread, on a real port, against a real
database; `LiveApi.run` executes a coroutine on that loop.

Seeded with something to aim at, so fuzzed requests reach past "404 not found": a submitted task, a
split and queued one, a registered executor and leases it holds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from minions import cluster_settings
from minions.config import Settings
from minions.db.connect import connect
from minions.embedded_pg import free_port
from minions.services.api.app import create_app
from minions.services.api.routes import openapi as openapi_routes
from minions.testing.factories import make_task, make_token

T = TypeVar("T")
SUBMITTED = ("search", "ranker", "fuzz-submitted")
QUEUED = ("search", "ranker", "fuzz-queued")
LEASES = 3
SUBTASKS = 500


def _write_input(path: Path, records: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(records):
        line = f'{{"id": "r{i:04d}", "ms": 1, "pad": "'
        lines.append(line + "x" * (100 - len(line) - 3) + '"}\n')
    assert all(len(line) == 100 for line in lines)
    path.write_text("".join(lines))


def app_with_openapi(settings: Settings) -> web.Application:
    """The real app, with GET /api/openapi.json added unless app.py already wires it in."""
    app = create_app(settings)
    if not any(r.resource is not None and r.resource.canonical == openapi_routes.PATH for r in app.router.routes()):
        openapi_routes.add_routes(app)
    return app


@dataclass
class Seeds:
    """Real identifiers, for fuzzed path parameters to hit now and then."""

    tasks: list[tuple[str, str, str]] = field(default_factory=list)
    executor_ids: list[str] = field(default_factory=list)
    lease_tokens: list[str] = field(default_factory=list)


class LiveApi:
    """`with LiveApi(make_database, store_root) as api:` serves at `api.url`, with `api.admin` and
    `api.executor` tokens. `make_database` (e.g. `TestDatabases.fresh`) runs on the server's loop."""

    def __init__(self, make_database: Callable[[], Awaitable[str]], store_root: Path, **overrides: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store_root = store_root
        self._make_database = make_database
        # A claim's long poll is cut to long_poll_s: short, so that fuzzed claims do not stall the run.
        self._settings = {"long_poll_s": 0.05, "lease_timeout_s": 600.0, "heartbeat_interval_s": 60.0,
                          **overrides}
        self.admin = ""
        self.executor = ""
        self.seeds = Seeds()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="live-api", daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> LiveApi:
        self._thread.start()
        try:
            self.run(self._start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self._runner is not None:
            self.run(self._runner.cleanup())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        database_url = await self._make_database()
        settings = Settings(database_url=database_url, store=self.store_root.as_uri(), host="127.0.0.1",
                            port=self.port, **self._settings)
        conn = await connect(database_url)
        try:
            self.admin, _ = await make_token(conn, "admin")
            self.executor, _ = await make_token(conn, "executor")
            await cluster_settings.apply_given(conn, settings)  # the lease timeout is the database's
            # make_task's subtasks are 100 bytes and one record each: an input that really is so, so
            # that the results of a cancelled task (an error line per record) can be read.
            seed = self.store_root / "inputs" / "seed.jsonl"
            await asyncio.to_thread(_write_input, seed, SUBTASKS)
            await make_task(conn, team=QUEUED[0], project=QUEUED[1], name=QUEUED[2], subtasks=SUBTASKS,
                            input_uri=seed.as_uri())
        finally:
            await conn.close()
        self._runner = web.AppRunner(app_with_openapi(settings))
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        await self._seed()

    async def _seed(self) -> None:
        async with aiohttp.ClientSession(self.url) as session:
            async def post(path: str, token: str, body: Any = None) -> Any:
                headers = {"Authorization": f"Bearer {token}"}
                async with session.post(path, json=body, headers=headers) as resp:
                    assert resp.status in (200, 201), (path, resp.status, await resp.text())
                    return await resp.json()

            team, project, name = SUBMITTED
            await post("/api/v1/tasks", self.admin, {
                "team": team, "project": project, "name": name, "kind": "sleep",
                "input": {"records": [{"id": "a", "ms": 1}, {"id": "b", "ms": 1}]}})
            self.seeds.tasks += [SUBMITTED, QUEUED]
            registered = await post("/api/v1/executors/register", self.executor, {
                "name": "fuzz-executor", "hardware": {"os": "test"}, "kinds": ["sleep"]})
            executor_id = registered["executor_id"]
            self.seeds.executor_ids.append(executor_id)
            for _ in range(LEASES):
                lease = await post(f"/api/v1/executors/{executor_id}/claim?wait=0", self.executor)
                self.seeds.lease_tokens.append(lease["lease"]["token"])
