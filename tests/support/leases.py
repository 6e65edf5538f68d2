"""The executor protocol one step at a time, for probes that must misbehave between the steps (write
after complete, complete a wrong output, tamper with the store). A plain HTTP client of API.md."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl

from minions import jsoncodec


@dataclass
class Reply:
    status: int
    body: Any

    @property
    def code(self) -> str | None:
        return self.body.get("error", {}).get("code") if isinstance(self.body, dict) else None


@dataclass
class LeaseSteps:
    api_url: str
    admin: str
    executor: str
    session: aiohttp.ClientSession

    async def call(self, method: str, path: str, token: str, json: Any = None) -> Reply:
        async with self.session.request(method, self.api_url + path, json=json,
                                        headers={"Authorization": f"Bearer {token}"}) as resp:
            raw = await resp.read()
            return Reply(resp.status, jsoncodec.loads(raw) if resp.content_type == "application/json" else raw)

    async def submit_sleep(self, name: str, ids: list[str], subtask_size: int) -> None:
        reply = await self.call("POST", "/api/v1/tasks", self.admin, {
            "team": "search", "project": "ranker", "name": name, "kind": "sleep", "subtask_size": subtask_size,
            "input": {"records": [{"id": i, "ms": 1} for i in ids]}})
        assert reply.status == 201, reply.body

    async def register(self, name: str) -> str:
        reply = await self.call("POST", "/api/v1/executors/register", self.executor,
                                {"name": name, "hardware": {}, "kinds": ["sleep"]})
        assert reply.status == 201, reply.body
        executor_id: str = reply.body["executor_id"]
        return executor_id

    async def claim(self, executor_id: str) -> dict[str, Any]:
        """The next lease (waits for the splitter)."""
        for _ in range(20):
            reply = await self.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=5", self.executor)
            if reply.status == 200:
                lease: dict[str, Any] = reply.body
                return lease
            assert reply.status == 204, reply.body
        raise AssertionError("no lease to claim")

    async def put(self, url: str, body: bytes) -> Reply:
        async with self.session.put(yarl.URL(url, encoded=True), data=body) as resp:
            raw = await resp.read()
            return Reply(resp.status, jsoncodec.loads(raw) if resp.content_type == "application/json" else raw)

    async def complete(self, lease: dict[str, Any], records: int | None = None) -> Reply:
        count = records if records is not None else lease["subtask"]["input"]["records"]
        return await self.call("POST", f"/api/v1/leases/{lease['lease']['token']}/complete", self.executor,
                               {"records": count, "seconds": 0.1})

    async def end(self, lease: dict[str, Any], action: str) -> Reply:
        """fail or release."""
        return await self.call("POST", f"/api/v1/leases/{lease['lease']['token']}/{action}", self.executor,
                               {"error": "probe", "retryable": True} if action == "fail" else None)

    async def lease_state(self, executor_id: str, lease: dict[str, Any]) -> str:
        token = lease["lease"]["token"]
        reply = await self.call("POST", f"/api/v1/executors/{executor_id}/heartbeat", self.executor,
                                {"leases": [token]})
        state: str = reply.body["leases"][token]
        return state

    async def results(self, name: str) -> tuple[int, bytes, bool]:
        """(status, the bytes received, whether the response ended cleanly)."""
        url = f"{self.api_url}/api/v1/tasks/search/ranker/{name}/results"
        received = bytearray()
        async with self.session.get(url, headers={"Authorization": f"Bearer {self.admin}"}) as resp:
            try:
                async for chunk in resp.content.iter_any():
                    received += chunk
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, asyncio.IncompleteReadError):
                return resp.status, bytes(received), False
            return resp.status, bytes(received), True

    async def task_status(self, name: str) -> str:
        reply = await self.call("GET", f"/api/v1/tasks/search/ranker/{name}", self.admin)
        status: str = reply.body["status"]
        return status


def sleep_output(ids: list[str], ms: int = 1) -> bytes:
    """A conforming output of sleep records: one line per id, in order."""
    return b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": ms}) for i in ids)
