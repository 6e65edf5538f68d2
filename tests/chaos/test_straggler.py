"""Drill: straggler backup. One executor of the fleet runs 20 times slower than the others; with
MINIONS_STRAGGLER_FACTOR=3 an idle agent runs a copy of its lease once nothing is pending, the
copy commits first, and the task ends near the makespan of the same task on a healthy fleet. The
audit shows the straggler's attempt `superseded`, and its late completion is refused."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from minions.testing.audit import audit
from minions.testing.cluster import Cluster, ClusterFactory, eventually, pick, sleep_records
from minions.testing.drill_executors import DrillExecutor

SLOWDOWN = 20.0


def _makespan(task: dict[str, Any]) -> float:
    return (datetime.fromisoformat(task["finished_at"]) - datetime.fromisoformat(task["created_at"])).total_seconds()


async def _run(cluster: Cluster, name: str, records: list[dict[str, Any]], odd_one: DrillExecutor) -> float:
    stop = asyncio.Event()
    run = asyncio.create_task(odd_one.run(stop))
    try:
        await eventually(lambda: _registered(odd_one), f"{odd_one.name} to register", timeout=20)
        await asyncio.sleep(0.3)  # its first long-poll is waiting, like the agents'
        await cluster.submit(name, records, subtask_size=1)
        task = await cluster.wait_finished(name, timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(run, return_exceptions=True), 30)
    return _makespan(task)


async def _registered(executor: DrillExecutor) -> bool:
    return bool(executor.executor_id)


async def test_straggler_is_backed_up_and_the_task_ends_near_the_normal_makespan(
        make_cluster: ClusterFactory, database_url: str) -> None:
    cluster: Cluster = await make_cluster(database_url, straggler_factor=3.0, long_poll_s=1.0)
    await cluster.services.start_all()
    await cluster.start_agents(pick(5, 9))
    ms = 500
    records = sleep_records(pick(30, 120), ms=ms)

    steady = DrillExecutor(cluster.services.api_url, cluster.executor_token, "steady")
    normal = await _run(cluster, "normal", records, steady)
    await audit(cluster, "normal", records)
    assert steady.completed, "the odd executor took no part in the baseline"

    slow = DrillExecutor(cluster.services.api_url, cluster.executor_token, "slow", slowdown=SLOWDOWN)
    makespan = await _run(cluster, "straggler", records, slow)
    report = await audit(cluster, "straggler", records)
    print(f"{report.summary()}; makespan {makespan:.2f} s against {normal:.2f} s normal "
          f"(the straggler alone would take {SLOWDOWN * ms / 1000:.0f} s)")

    assert len(slow.leases) >= 1 and not slow.leases[0]["backup"], slow.leases
    sid, token = slow.leases[0]["subtask_id"], slow.leases[0]["token"]
    history = report.attempts[sid]
    # Both rows are written by the winner's commit, in one transaction (same ended_at).
    assert sorted(a["outcome"] for a in history) == ["done", "superseded"], history
    superseded = next(a for a in history if a["outcome"] == "superseded")
    assert str(superseded["lease_token"]) == token and all(a["attempt"] == 1 for a in history), history
    assert report.outcomes["superseded"] == 1, report.summary()
    assert slow.completed == [] and slow.late.get("complete") == 409, slow.late
    # Near the normal makespan: at most a long poll (an idle executor looks for stragglers when
    # its claim wakes) and one more subtask later, far from the straggler's own time.
    assert makespan <= normal + cluster.services.long_poll_s + 2 * ms / 1000 + 1.5, (makespan, normal)
    assert makespan < SLOWDOWN * ms / 1000 - 2, makespan
