"""`minions api --workers 2` (services/api/prefork.py): two processes serve the one address, each
with its own LISTEN connection, so a submitted task wakes the long-polling claims held by either."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from minions.services.api.main import WORKER_HEADER
from minions.testing.factories import make_tokens
from minions.testing.processes import Services

CLAIMERS = 24


async def test_two_workers_serve_requests_and_both_wake_their_claims(services: Services, database_url: str) -> None:
    admin, executor = await make_tokens(database_url)
    services.long_poll_s = 20.0
    services.extra_env["MINIONS_API_WORKERS"] = "2"
    services.split_at_submit = False  # through the splitter: a NOTIFY, later
    await services.start_all()
    url = services.api_url
    ex_headers = {"Authorization": f"Bearer {executor}"}
    # A connection per request, so the kernel spreads them over the workers' sockets.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        ids = []
        for i in range(CLAIMERS):
            async with session.post(f"{url}/api/v1/executors/register", headers=ex_headers, json={
                    "name": f"w-{i}", "hardware": {"os": "test", "device": "cpu"}, "kinds": ["sleep"]}) as resp:
                assert resp.status == 201, await resp.text()
                ids.append((await resp.json())["executor_id"])

        async def claim(executor_id: str) -> tuple[int, str, float]:
            async with session.post(f"{url}/api/v1/executors/{executor_id}/claim", params={"wait": "20"},
                                    headers=ex_headers) as resp:
                await resp.read()
                return resp.status, resp.headers[WORKER_HEADER], time.monotonic()

        claims = [asyncio.create_task(claim(e)) for e in ids]
        await asyncio.sleep(2)  # every claim is waiting now: nothing is pending
        assert not any(c.done() for c in claims)
        submitted = time.monotonic()
        task = {"team": "search", "project": "p", "name": "wake", "kind": "sleep", "subtask_size": 1,
                "input": {"records": [{"id": f"r{i}", "ms": 1} for i in range(CLAIMERS)]}}
        async with session.post(f"{url}/api/v1/tasks", json=task,
                                headers={"Authorization": f"Bearer {admin}"}) as resp:
            assert resp.status == 201, await resp.text()
        answers = await asyncio.gather(*claims)
    assert {status for status, _, _ in answers} == {200}
    assert all(at - submitted < 15 for _, _, at in answers)  # woken, not timed out
    workers = {pid for _, pid, _ in answers}
    assert len(workers) == 2, f"claims answered by {workers}"
