"""A claim whose answer never reaches its executor: the lease is committed, then the API process
dies (kill -9) or the network drops before the response arrives. The executor retries its claim,
gets other work, and keeps heartbeating; it never names the lost lease.

Heartbeats are authoritative: a heartbeat names every lease its executor holds, so a lease it
leaves out for longer than the lease timeout is ended `lost` and requeued, as a silent executor's
would be (without that, the service-kill drill left such a task unable to end about one run in
five).
"""

from __future__ import annotations

import asyncio

import aiohttp

from minions.testing.audit import audit
from minions.testing.cluster import LEASE_TIMEOUT_S, Cluster, sleep_records


async def test_a_lease_whose_claim_answer_was_lost_is_reclaimed(cluster: Cluster) -> None:
    records = sleep_records(6, ms=20)
    headers = {"Authorization": f"Bearer {cluster.executor_token}"}
    api = f"{cluster.services.api_url}/api/v1"
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(f"{api}/executors/register", json={"name": "forgetful", "kinds": ["sleep"]}) as resp:
            executor_id = (await resp.json())["executor_id"]
        await cluster.submit("lost-answer", records, subtask_size=1)
        claim_url = f"{api}/executors/{executor_id}/claim"
        async with session.post(claim_url, params={"wait": "5"}) as resp:
            assert resp.status == 200
            await resp.read()  # ...and imagine this answer never arrived: the executor holds nothing

        await cluster.start_agents(1)  # the rest of the work gets done meanwhile
        # The executor lives on: it heartbeats (holding nothing) as any idle agent does.
        for _ in range(int(4 * LEASE_TIMEOUT_S / 0.5)):
            async with session.post(f"{api}/executors/{executor_id}/heartbeat", json={"leases": []}) as resp:
                assert resp.status == 200
            task = await cluster.task("lost-answer")
            if task["finished_at"]:
                break
            await asyncio.sleep(0.5)
    assert task["finished_at"], f"the task never ended: {task['subtasks']} (held by 'forgetful')"
    report = await audit(cluster, "lost-answer", records)
    assert report.outcomes["lost"] == 1, report.summary()
