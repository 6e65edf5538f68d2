"""FakeApi: a test double of the API's executor protocol (API.md) plus a signed-URL object store,
in memory, so the agent's loop can be driven through real HTTP before the real services exist."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from aiohttp import web

from minions import jsoncodec

REGISTER = "/api/v1/executors/register"


class FakeApi:
    def __init__(self, heartbeat_interval_s: float = 0.1, long_poll_s: float = 0.2, token: str = "tok") -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.long_poll_s = long_poll_s
        self.token = token
        self.url = ""
        self.pending: list[dict[str, Any]] = []
        self.states: dict[str, str] = {}  # lease token -> ok | lost | cancelled | done | failed | released
        self.objects: dict[str, bytes] = {}
        self.events: list[tuple[str, Any]] = []
        self._ids = itertools.count(1)
        self.register_error: dict[str, Any] | None = None  # answer registration with this 422

    # -- test helpers -------------------------------------------------------------------------

    def add_subtask(
        self,
        kind: str,
        records: list[dict[str, Any]],
        model: str | None = None,
        params: dict[str, Any] | None = None,
        count: int | None = None,
    ) -> str:
        n = next(self._ids)
        prefix = b'{"id": "belongs-to-another-subtask"}\n'
        body = b"".join(jsoncodec.dumps_line(r) for r in records)
        self.objects[f"in-{n}"] = prefix + body + b'{"id": "after"}\n'
        token = f"lease-{n}"
        self.states[token] = "ok"
        self.pending.append(
            {
                "lease": {"token": token, "expires_at": "2026-11-29T12:00:00+00:00"},
                "subtask": {
                    "team": "search",
                    "project": "ranker",
                    "task_name": "t",
                    "subtask_id": n,
                    "attempt": 1,
                    "kind": kind,
                    "model": model,
                    "params": params or {},
                    "input": {
                        "url": f"{self.url}/store/in-{n}?X-Amz-Signature=a%2Fb",
                        "range": [len(prefix), len(prefix) + len(body)],
                        "records": len(records) if count is None else count,
                    },
                    "output": {"url": f"{self.url}/store/out-{n}?X-Amz-Signature=c%2Fd"},
                },
            }
        )
        return token

    def output(self, token: str) -> list[dict[str, Any]]:
        raw = self.objects[f"out-{token.removeprefix('lease-')}"]
        return [jsoncodec.loads(line) for line in raw.splitlines()]

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
        # Polling is the simplest honest wait here: the state changes in HTTP handlers.
        async with asyncio.timeout(timeout_s):
            while not condition():  # noqa: ASYNC110
                await asyncio.sleep(0.02)

    # -- the HTTP side ------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post(REGISTER, self._register)
        app.router.add_post("/api/v1/executors/{id}/claim", self._claim)
        app.router.add_post("/api/v1/executors/{id}/heartbeat", self._heartbeat)
        app.router.add_post("/api/v1/executors/{id}/deregister", self._deregister)
        app.router.add_post("/api/v1/leases/{token}/{action}", self._lease)
        app.router.add_get("/store/{key}", self._get)
        app.router.add_put("/store/{key}", self._put)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/api/") and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"error": {"code": "unauthorized", "message": "bad token"}}, status=401)
        if request.path.startswith("/store/") and "Authorization" in request.headers:
            return web.Response(status=400, text="presigned requests carry no Authorization")
        return await handler(request)  # type: ignore[no-any-return]

    async def _register(self, request: web.Request) -> web.Response:
        self.events.append(("register", await request.json()))
        if self.register_error is not None:
            return web.json_response(self.register_error, status=422)
        return web.json_response(
            {
                "executor_id": "exec-1",
                "heartbeat_interval_s": self.heartbeat_interval_s,
                "lease_timeout_s": 10 * self.heartbeat_interval_s,
                "long_poll_s": self.long_poll_s,
            },
            status=201,
        )

    async def _claim(self, request: web.Request) -> web.Response:
        deadline = asyncio.get_running_loop().time() + float(request.query["wait"])
        while not self.pending:
            if asyncio.get_running_loop().time() >= deadline:
                return web.Response(status=204)
            await asyncio.sleep(0.02)
        lease = self.pending.pop(0)
        self.events.append(("claim", lease["lease"]["token"]))
        return web.json_response(lease)

    async def _heartbeat(self, request: web.Request) -> web.Response:
        tokens = (await request.json())["leases"]
        self.events.append(("heartbeat", tokens))
        return web.json_response({"leases": {t: self.states.get(t, "lost") for t in tokens}})

    async def _deregister(self, request: web.Request) -> web.Response:
        self.events.append(("deregister", request.match_info["id"]))
        return web.json_response({"status": "offline", "released": 0})

    async def _lease(self, request: web.Request) -> web.Response:
        token, action = request.match_info["token"], request.match_info["action"]
        body = await request.json() if request.can_read_body else None
        if self.states.get(token) != "ok":
            self.events.append((f"{action}_refused", token))
            return web.json_response({"error": {"code": "lease_lost", "message": "not current"}}, status=409)
        self.events.append((action, (token, body)))
        self.states[token] = {"complete": "done", "fail": "failed", "release": "released"}[action]
        return web.json_response({"status": "ok"})

    async def _get(self, request: web.Request) -> web.Response:
        assert request.raw_path.endswith("X-Amz-Signature=a%2Fb"), request.raw_path
        data = self.objects[request.match_info["key"]]
        start, end = (int(x) for x in request.headers["Range"].removeprefix("bytes=").split("-"))
        return web.Response(status=206, body=data[start : end + 1])

    async def _put(self, request: web.Request) -> web.Response:
        assert request.raw_path.endswith("X-Amz-Signature=c%2Fd"), request.raw_path
        self.objects[request.match_info["key"]] = await request.read()
        return web.Response(status=200)
