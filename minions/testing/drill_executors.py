"""Misbehaving executors for the drills: small in-process clients of the executor protocol that
extend the test SleepExecutor (minions/testing/sleep_executor.py) with the faults real agents cannot be told to have.

- `hang_until`: claims, stops heartbeating while keeping its connection, and when the event is set
  tries to finish anyway (PUT its output, then complete): its late answers are recorded.
- `slowdown`: sleeps that many times longer than asked (a straggler); heartbeats, and like a real
  agent stops as soon as a heartbeat says its lease is gone, then still tries to complete.
- poison: a subtask holding a record with `"poison": true` (an extra field the API accepts and
  the sleep kind ignores) is failed, retryably, every time this executor gets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl

from minions import jsoncodec
from minions.testing.sleep_executor import SleepExecutor

POISON_ERROR = "poison record {id}: this record fails every time"


@dataclass
class DrillExecutor(SleepExecutor):
    slowdown: float = 1.0
    hang_until: asyncio.Event | None = None
    leases: list[dict[str, Any]] = field(default_factory=list)  # every claim: subtask_id, token, backup
    late: dict[str, Any] = field(default_factory=dict)  # what the late calls were answered
    failed: list[int] = field(default_factory=list)
    retired: bool = False  # a hung executor claims nothing more once it has come back

    async def run(self, stop: asyncio.Event, wait_s: float = 1) -> None:
        """Like SleepExecutor.run, but rides out 503s and dropped connections, as drills cause."""
        async with aiohttp.ClientSession() as session:
            while not self.executor_id:
                try:
                    await self.register(session)
                except (aiohttp.ClientError, AssertionError):
                    await asyncio.sleep(0.2)
            while not stop.is_set() and not self.retired:
                try:
                    async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/claim",
                                            params={"wait": str(wait_s)}, headers=self._headers()) as resp:
                        if resp.status != 200:
                            await resp.read()
                            if resp.status != 204:
                                await asyncio.sleep(0.2)
                            continue
                        lease = await resp.json()
                except aiohttp.ClientError:
                    await asyncio.sleep(0.2)
                    continue
                await self.work(session, lease)

    async def work(self, session: aiohttp.ClientSession, lease: dict[str, Any]) -> None:
        token, sub = lease["lease"]["token"], lease["subtask"]
        self.leases.append({"subtask_id": sub["subtask_id"], "task_name": sub["task_name"], "token": token,
                            "backup": lease["lease"].get("backup", False)})
        records = await self._download(session, sub)
        if records is None:  # the lease ended before its input was read
            self.refused += 1
            return
        if any(r.get("poison") for r in records):
            poison = next(r for r in records if r.get("poison"))
            async with session.post(f"{self.api_url}/api/v1/leases/{token}/fail", headers=self._headers(),
                                    json={"error": POISON_ERROR.format(id=poison["id"]), "retryable": True}) as resp:
                assert resp.status == 200, await resp.text()
            self.failed.append(sub["subtask_id"])
            return
        if self.hang_until is not None:
            await self.hang_until.wait()  # silent: no heartbeat, the connection stays open
            await self._finish_late(session, token, sub, records)
            self.retired = True
            return
        gone = asyncio.Event()
        beat = asyncio.create_task(self._beat_until_gone(session, token, gone))
        started = time.monotonic()
        try:
            for record in records:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(gone.wait(), self.slowdown * record["ms"] / 1000)
                if gone.is_set():
                    break
        finally:
            beat.cancel()
        if gone.is_set():
            await self._finish_late(session, token, sub, records)
            return
        await self._put(session, sub, records)
        await self.complete(session, token, sub, len(records), started)

    async def _put(self, session: aiohttp.ClientSession, sub: dict[str, Any], records: list[dict[str, Any]],
                   **marks: Any) -> int:
        body = b"".join(jsoncodec.dumps_line({"id": r["id"], "slept_ms": r["ms"], **marks}) for r in records)
        async with session.put(yarl.URL(sub["output"]["url"], encoded=True), data=body) as resp:
            return resp.status

    async def _finish_late(self, session: aiohttp.ClientSession, token: str, sub: dict[str, Any],
                           records: list[dict[str, Any]]) -> None:
        """A lease that is no longer current tries everything anyway; each answer is recorded."""
        self.late["put"] = await self._put(session, sub, records, late=self.name)
        async with session.post(f"{self.api_url}/api/v1/leases/{token}/complete", headers=self._headers(),
                                json={"records": len(records), "seconds": 1.0}) as resp:
            self.late["complete"] = resp.status
            self.late["complete_code"] = (await resp.json())["error"]["code"] if resp.status >= 400 else 0
        async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/heartbeat",
                                json={"leases": [token]}, headers=self._headers()) as resp:
            self.late["heartbeat"] = resp.status
            self.late["heartbeat_says_ok"] = int((await resp.json())["leases"][token] == "ok")
        async with session.post(f"{self.api_url}/api/v1/leases/{token}/fail", headers=self._headers(),
                                json={"error": "late", "retryable": True}) as resp:
            self.late["fail"] = resp.status
        async with session.post(f"{self.api_url}/api/v1/leases/{token}/release", headers=self._headers()) as resp:
            self.late["release"] = resp.status
        if self.late["complete"] == 409:
            self.refused += 1

    async def _beat_until_gone(self, session: aiohttp.ClientSession, token: str, gone: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/heartbeat",
                                        json={"leases": [token]}, headers=self._headers()) as resp:
                    if resp.status != 200:
                        continue
                    state = (await resp.json())["leases"].get(token)
            except aiohttp.ClientError:
                continue
            if state != "ok":
                gone.set()
                return
