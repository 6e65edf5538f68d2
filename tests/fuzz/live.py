"""A real API server for synchronous clients (schemathesis drives it with `requests`): the app, with
its OpenAPI route, runs on its own event loop in a background thread, on a real port, against a real
database; `LiveApi.run` executes a coroutine on that loop.

Seeded with something to aim at, so fuzzed requests reach past "404 not found": a submitted task, a
split and queued one, a registered executor and leases it holds, a /v1 file and a /v1 batch.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from minions import cluster_settings, jsoncodec
from minions.config import Settings
from minions.db.connect import connect
from minions.embedded_pg import free_port
from minions.services.api.app import create_app
from minions.services.api.openapi import routes as openapi_routes
from minions.testing.factories import make_task, make_token
from minions.testing.sleep_executor import SleepExecutor

T = TypeVar("T")
SUBMITTED = ("search", "ranker", "fuzz-submitted")
QUEUED = ("search", "ranker", "fuzz-queued")
LEASES = 3
# The one model the interactive executor serves: fuzzed /v1 interactive requests name it, so they are
# answered (no model a fuzzed registration makes up is ever served long enough to be waited on).
FUZZ_MODEL = "fuzz-interactive-model"
OPENAI_LINE = b'{"custom_id":"c","method":"POST","url":"/v1/embeddings","body":{"model":"m","input":"x"}}\n'
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


INTERACTIVE = ("/v1/embeddings", "/v1/chat/completions", "/v1/completions")


def aim_at_served_model(case: Any) -> None:
    """A /v1 interactive request naming a valid model names FUZZ_MODEL instead: it is answered by the
    interactive executor, never left waiting for an executor that a fuzzed registration made up (a
    request whose model is the invalid part stays as it is)."""
    body = case.body
    if case.path in INTERACTIVE and isinstance(body, dict):
        model = body.get("model")
        if isinstance(model, str) and 1 <= len(model) <= 256 and "\x00" not in model:
            body["model"] = FUZZ_MODEL


class InteractiveExecutor(SleepExecutor):
    """Serves FUZZ_MODEL for embeddings and completions with fixed answers, so that /v1's interactive
    lane answers fuzzed requests end to end (submit, claim, complete, OpenAI's response)."""

    async def serve(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            await self.register(session, kinds=["embedding", "completion"], models=[FUZZ_MODEL])
            while not stop.is_set():
                async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/claim",
                                        params={"wait": "5"}, headers=self._headers()) as resp:
                    lease = await resp.json() if resp.status == 200 else None
                if lease is None:
                    await asyncio.sleep(0.05)  # (the live server cuts a long poll to long_poll_s)
                    continue
                await self.answer(session, lease)

    async def answer(self, session: aiohttp.ClientSession, lease: dict[str, Any]) -> None:
        sub, started = lease["subtask"], time.monotonic()
        records = await self._download(session, sub)
        if records is None:  # the lease ended before its input was read
            return
        out = b"".join(jsoncodec.dumps_line(
            {"id": r["id"], "embedding": [0.5, -0.25], "usage": {"prompt_tokens": 1}} if "text" in r
            else {"id": r["id"], "text": "ok", "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
            for r in records)
        await self.complete(session, lease["lease"]["token"], sub, len(records), started, out)


@dataclass
class Seeds:
    """Real identifiers, for fuzzed path parameters to hit now and then."""

    tasks: list[tuple[str, str, str]] = field(default_factory=list)
    executor_ids: list[str] = field(default_factory=list)
    lease_tokens: list[str] = field(default_factory=list)
    file_ids: list[str] = field(default_factory=list)  # /v1 files
    batch_ids: list[str] = field(default_factory=list)  # /v1 batches


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
        self._stop_executor = asyncio.Event()
        self._executor: asyncio.Task[None] | None = None

    def __enter__(self) -> LiveApi:
        self._thread.start()
        try:
            self.run(self._start())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self._executor is not None:
            self._loop.call_soon_threadsafe(self._executor.cancel)
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
            # Vouched for, as `minions up`'s own agents are: a volunteer's results are held until another
            # owner's executor checks them, and here no other executor serves /v1/embeddings.
            self.executor, _ = await make_token(conn, "executor", trusted=True)
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
        executor = InteractiveExecutor(self.url, self.executor, "fuzz-interactive-executor")
        self._executor = asyncio.ensure_future(executor.serve(self._stop_executor))

    async def _seed(self) -> None:
        async with aiohttp.ClientSession(self.url) as session:
            async def post(path: str, token: str, body: Any = None) -> Any:
                headers = {"Authorization": f"Bearer {token}"}
                sent = {"data": body} if isinstance(body, aiohttp.FormData) else {"json": body}
                async with session.post(path, headers=headers, **sent) as resp:
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

            # /v1: a batch input file, and a batch made of it (failed validation: no executor serves
            # the model here, so it has ended and its files can be read).
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", OPENAI_LINE * 3, filename="fuzz.jsonl", content_type="application/jsonl")
            uploaded = await post("/v1/files", self.admin, form)
            batch = await post("/v1/batches", self.admin, {
                "input_file_id": uploaded["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"})
            self.seeds.file_ids.append(uploaded["id"])
            self.seeds.batch_ids.append(batch["id"])
