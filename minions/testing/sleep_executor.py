"""A test executor that speaks the executor protocol over HTTP and runs the `sleep` kind.

Not a stand-in for the agent (agents/macos is tested end to end on its own): a small, independent
client of API.md, so the control plane's tests do not depend on the agent's code."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl

from minions import jsoncodec


@dataclass
class SleepExecutor:
    api_url: str
    token: str
    name: str
    executor_id: str = ""
    heartbeat_interval_s: float = 1.0
    completed: list[tuple[str, int]] = field(default_factory=list)
    refused: int = 0
    hang_after_claim: bool = False  # drills: keeps the socket, stops heartbeating
    inline_output: bool = False  # the output in the complete's body (`output`), no PUT

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def register(self, session: aiohttp.ClientSession, **extra: Any) -> None:
        body = {"name": self.name, "hardware": {"os": "test", "device": "cpu"}, "kinds": ["sleep"], **extra}
        async with session.post(f"{self.api_url}/api/v1/executors/register", json=body,
                                headers=self._headers()) as resp:
            assert resp.status == 201, await resp.text()
            reply = await resp.json()
        self.executor_id = reply["executor_id"]
        self.heartbeat_interval_s = reply["heartbeat_interval_s"]

    async def run(self, stop: asyncio.Event, wait_s: float = 2) -> None:
        async with aiohttp.ClientSession() as session:
            if not self.executor_id:
                await self.register(session)
            while not stop.is_set():
                if (lease := await self.claim(session, wait_s)) is not None:
                    await self.work(session, lease)

    async def claim(self, session: aiohttp.ClientSession, wait_s: float = 2) -> dict[str, Any] | None:
        """One lease (the claim's answer), or None when none came within `wait_s` (204)."""
        async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/claim",
                                params={"wait": str(wait_s)}, headers=self._headers()) as resp:
            if resp.status == 204:
                return None
            assert resp.status == 200, await resp.text()
            lease: dict[str, Any] = await resp.json()
            return lease

    async def work(self, session: aiohttp.ClientSession, lease: dict[str, Any]) -> None:
        token, sub = lease["lease"]["token"], lease["subtask"]
        records = await self._download(session, sub)
        if records is None:  # the lease ended before its input was read (its task replaced or deleted)
            self.refused += 1
            return
        if self.hang_after_claim:
            await asyncio.sleep(3600)
        beat = asyncio.create_task(self._heartbeat(session, token))
        started = time.monotonic()
        try:
            out = []
            for record in records:
                await asyncio.sleep(record["ms"] / 1000)
                out.append(jsoncodec.dumps_line({"id": record["id"], "slept_ms": record["ms"]}))
        finally:
            beat.cancel()
        output = b"".join(out)
        if not self.inline_output:
            async with session.put(yarl.URL(sub["output"]["url"], encoded=True), data=output) as resp:
                if resp.status == 403:  # lease_ended: cancelled (or its task replaced) while it slept
                    self.refused += 1
                    return
                assert resp.status == 200, f"output PUT: {resp.status} {await resp.text()}"
        await self.complete(session, token, sub, len(records), started,
                            output if self.inline_output else None)

    async def _download(self, session: aiohttp.ClientSession, sub: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The subtask's records, read from its signed input URL's byte range (the store's GET is what
        this executor exercises), or inline when the task's input has no object (kept in the database);
        None when the store refuses the URL: the lease ended meanwhile (403), or its task went (404)."""
        start, end = sub["input"]["range"]
        if sub["input"]["url"] is None:
            data: bytes = sub["input"]["data"].encode()
        else:
            async with session.get(yarl.URL(sub["input"]["url"], encoded=True),
                                   headers={"Range": f"bytes={start}-{end - 1}"}) as resp:
                if resp.status in (403, 404):
                    return None
                assert resp.status in (200, 206), f"input GET: {resp.status}"
                data = await resp.read()
        lines = [line for line in data.splitlines() if line.strip()]
        records = [jsoncodec.loads(line) for line in lines]
        assert len(records) == sub["input"]["records"]
        return records

    async def complete(self, session: aiohttp.ClientSession, token: str, sub: dict[str, Any], records: int,
                       started: float, output: bytes | None = None) -> None:
        """Commit the lease (`output`: carried inline); a refusal (409: the lease is gone; 404: its task
        was deleted, as `submit --replace` does) is counted, not raised."""
        body: dict[str, Any] = {"records": records, "seconds": time.monotonic() - started}
        if output is not None:
            body["output"] = output.decode()
        async with session.post(f"{self.api_url}/api/v1/leases/{token}/complete", headers=self._headers(),
                                json=body) as resp:
            if resp.status in (404, 409):
                self.refused += 1
                return
            assert resp.status == 200, await resp.text()
        self.completed.append((sub["task_name"], sub["subtask_id"]))

    async def _heartbeat(self, session: aiohttp.ClientSession, token: str) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/heartbeat",
                                    json={"leases": [token]}, headers=self._headers()) as resp:
                await resp.read()
