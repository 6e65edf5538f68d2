"""Drill: kill -9 a quarter of the agents mid-task, and again near the end while they hold leases.
The watchdog reclaims what they held after the lease timeout; the survivors finish; the audit finds
nothing lost, nothing twice, and a `lost` attempt (with its reason) for every lease the dead held."""

from __future__ import annotations

import asyncio
import time

from minions.testing.audit import audit
from minions.testing.cluster import LEASE_TIMEOUT_S, Cluster, ClusterFactory, pick, sleep_records


async def test_kill_a_quarter_of_the_agents_mid_task_and_near_the_end(make_cluster: ClusterFactory,
                                                                     database_url: str) -> None:
    n_agents = pick(8, 16)
    quarter = n_agents // 4
    # The long form kills a quarter at each mark and starts as many fresh agents after each kill
    # but the last, so the fleet keeps churning.
    marks = pick([0.3, 0.75], [0.15, 0.35, 0.55, 0.7, 0.85])
    # Near the end few subtasks are left, and each round kills their holders: one subtask can lose
    # a lease at every mark. Enough attempts for that, so that nothing fails for want of them.
    cluster = await make_cluster(database_url, max_attempts=len(marks) + 1)
    await cluster.services.start_all()
    replace = pick(False, True)
    records = sleep_records(pick(120, 800), ms=pick(150, 80))
    await cluster.start_agents(n_agents)
    started = time.monotonic()
    await cluster.submit("churn", records, subtask_size=2)

    killed: dict[str, list[tuple[int, str]]] = {}
    for i, mark in enumerate(marks):
        await cluster.wait_progress("churn", mark, timeout=60)

        dead = await cluster.kill_holders(quarter, "churn")
        killed |= dead
        if replace and i < len(marks) - 1:
            await cluster.start_agents(len(dead), prefix=f"fresh{i}")

    task = await cluster.wait_finished("churn", timeout=pick(60, 240))
    makespan = time.monotonic() - started
    report = await audit(cluster, "churn", records)
    print(f"{report.summary()}; killed {sorted(killed)}; makespan {makespan:.1f} s")

    # Every lease a dead agent held was taken back: a lost attempt, with its reason.
    for name, held in killed.items():
        for subtask_id, token in held:
            assert await cluster.attempt_outcome(token) == ["lost"], (name, subtask_id)
            lost = next(a for a in report.attempts[subtask_id] if str(a["lease_token"]) == token)
            assert "no heartbeat" in lost["error"], lost
    assert report.outcomes["lost"] == sum(len(held) for held in killed.values()), report.summary()
    executors = {e["name"]: e["status"] for e in await cluster.client.executors()}
    assert all(executors[name] == "lost" for name in killed), executors
    assert task["records"]["done"] == len(records)
    # Each reclaim costs about one lease timeout; the work itself is a few seconds.
    assert makespan < 30 + len(marks) * (LEASE_TIMEOUT_S + 2), makespan



async def test_agent_killed_while_long_polling_and_restarted_under_its_name(
        make_cluster: ClusterFactory, database_url: str) -> None:
    """What launchd or systemd do after a crash: the same agent, at once, under the same name (so the
    same executor row). The dead process's long poll is still waiting on the server; it must not
    win a lease for the executor the new process keeps heartbeating, or that lease would never be
    reclaimed and the task never end."""
    cluster: Cluster = await make_cluster(database_url, long_poll_s=30.0)
    await cluster.services.start_all()
    agents = await cluster.start_agents(pick(2, 4), prefix="mac")
    await asyncio.sleep(1.0)  # every agent is in its 30 s long poll
    for agent in agents:
        agent.kill()
        cluster.fleet.start(agent.name)
    await asyncio.sleep(1.0)
    records = sleep_records(pick(12, 60), ms=20)
    await cluster.submit("restarted", records, subtask_size=1)
    await cluster.wait_finished("restarted", timeout=LEASE_TIMEOUT_S + 20)
    report = await audit(cluster, "restarted", records)
    assert report.outcomes["lost"] == 0, report.summary()
