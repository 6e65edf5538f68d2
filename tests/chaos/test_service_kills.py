"""Drill: kill -9 and restart the API, the splitter and the watchdog, one at a time, mid-task.

- API: agents and clients see connection errors, back off, and carry on against the new process
  (same port); long-polling claims resume; nothing committed is lost.
- splitter: a task submitted while it is dead is split by its successor (a sweep on start: the
  NOTIFY went to nobody).
- watchdog: an agent killed while the watchdog is dead still has its lease reclaimed by the next
  watchdog (a sweep on start: its deadlines lived only in the dead process).
"""

from __future__ import annotations

import asyncio

from minions.testing.audit import audit
from minions.testing.cluster import LEASE_TIMEOUT_S, Cluster, pick, sleep_records


async def test_kill_and_restart_each_service_mid_task(cluster: Cluster) -> None:
    # Every task goes through the splitter, none split at submission: the API is restarted below
    # before the splitter's turn, so the restarted one takes this.
    cluster.services.split_at_submit = False
    await cluster.start_agents(pick(4, 8))
    records = sleep_records(pick(120, 1500), ms=pick(100, 80))
    await cluster.submit("services", records, subtask_size=2)
    late_records = sleep_records(pick(20, 100), ms=5, prefix="late")
    rounds = pick(1, 3)
    victims: list[tuple[str, int, str]] = []
    for r in range(rounds):
        base = r / rounds

        # The API: down for a moment, then a new process on the same port.
        await cluster.wait_progress("services", base + 0.15 / rounds, timeout=60)
        cluster.services.running["api"].kill()
        await asyncio.sleep(0.5)
        cluster.services.start("api")
        await cluster.services.wait_healthy()

        # The splitter: a task submitted while it is dead waits for its successor.
        await cluster.wait_progress("services", base + 0.45 / rounds, timeout=60)
        cluster.services.running["splitter"].kill()
        name = f"while-splitter-dead-{r}"
        await cluster.submit(name, late_records, subtask_size=4)
        await asyncio.sleep(1.0)
        assert (await cluster.task(name))["status"] == "submitted"
        cluster.services.start("splitter")

        # The watchdog: an agent dies while it is dead; its successor still reclaims the lease.
        await cluster.wait_progress("services", base + 0.7 / rounds, timeout=60)
        cluster.services.running["watchdog"].kill()

        for holder, held in (await cluster.kill_holders(1)).items():  # "services", or a later task
            victims += [(holder, sid, token) for sid, token in held]
        # Down past the lease timeout: the successor's sweep on start is what reclaims.
        await asyncio.sleep(LEASE_TIMEOUT_S + 0.5)
        cluster.services.start("watchdog")
        await cluster.start_agents(1, prefix=f"spare{r}")  # keep the fleet's size

    await cluster.wait_finished("services", timeout=pick(60, 240))
    report = await audit(cluster, "services", records)
    print(report.summary())
    for r in range(rounds):
        name = f"while-splitter-dead-{r}"
        await cluster.wait_finished(name, timeout=30)
        await audit(cluster, name, late_records)
    for holder, subtask_id, token in victims:
        assert await cluster.attempt_outcome(token) == ["lost"], (holder, subtask_id)

