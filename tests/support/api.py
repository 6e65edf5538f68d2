"""An API server in this process on a real port, against a real database, for endpoint tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from minions import cluster_settings, jsoncodec
from minions.config import Settings
from minions.db.connect import connect
from minions.embedded_pg import free_port
from minions.services.api.app import create_app
from minions.testing.factories import make_token


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]

    @property
    def error(self) -> dict[str, Any]:
        assert isinstance(self.body, dict) and "error" in self.body, self.body
        error: dict[str, Any] = self.body["error"]
        return error


@dataclass
class ApiHarness:
    url: str
    settings: Settings
    admin: str
    executor: str
    session: aiohttp.ClientSession
    app: web.Application

    async def call(self, method: str, path: str, *, token: str | None = "admin", json: Any = None,
                   data: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
        hdrs = dict(headers or {})
        if token is not None:
            hdrs["Authorization"] = f"Bearer {self._token(token)}"
        if json is not None:
            data = jsoncodec.dumps(json)
            hdrs.setdefault("Content-Type", "application/json")
        async with self.session.request(method, self.url + path, data=data, headers=hdrs) as resp:
            raw = await resp.read()
            body: Any = raw
            if resp.content_type == "application/json" and raw:
                body = jsoncodec.loads(raw)
            return Reply(resp.status, body, dict(resp.headers))

    def _token(self, token: str) -> str:
        return {"admin": self.admin, "executor": self.executor}.get(token, token)

    async def register(self, name: str = "ex-1", kinds: list[str] | None = None, models: list[str] | None = None,
                       preferences: list[dict[str, Any]] | None = None, token: str = "executor") -> str:
        reply = await self.call("POST", "/api/v1/executors/register", token=token, json={
            "name": name, "hardware": {"os": "test", "device": "cpu"}, "kinds": kinds or ["sleep"],
            "models": models or [], "preferences": preferences or []})
        assert reply.status == 201, reply.body
        executor_id: str = reply.body["executor_id"]
        return executor_id


@asynccontextmanager
async def running_api(database_url: str, store_root: Path, **overrides: Any) -> AsyncIterator[ApiHarness]:
    port = free_port()
    settings = Settings(database_url=database_url, store=store_root.as_uri(), host="127.0.0.1", port=port,
                        **{"long_poll_s": 30.0, "lease_timeout_s": 60.0, "heartbeat_interval_s": 5.0,
                           # Spot checks off unless a test asks: chance must not hold results.
                           "spot_check_share": 0.0, "trust_agreements": 0, **overrides})
    conn = await connect(database_url)
    admin, _ = await make_token(conn, "admin")
    executor, _ = await make_token(conn, "executor")
    await cluster_settings.apply_given(conn, settings)  # the lease timeout is the database's
    await conn.close()
    app = create_app(settings)
    # The API's own shutdown timeout (services/api/main.py), not aiohttp's default of 60 s: a
    # connection still draining an oversized body it answered 413 holds the shutdown until then.
    runner = web.AppRunner(app, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    async with aiohttp.ClientSession() as session:
        try:
            yield ApiHarness(f"http://127.0.0.1:{port}", settings, admin, executor, session, app)
        finally:
            await runner.cleanup()
