"""Drill: three API replicas behind HAProxy (infra/haproxy/haproxy.cfg), two splitters, two
watchdogs, agents connected through the balancer.

- A task submitted through one replica is claimed by executors long-polling on the others: the
  NOTIFY that wakes a claim reaches every replica (each LISTENs), so the claim returns long before
  its long-poll would have ended.
- kill -9 of a replica mid-task costs nothing: its long-polls reconnect through the balancer, its
  in-flight requests are answered 502 and retried by the agents; the replica comes back later.
- Two splitters never split one task twice: each task is split by exactly one of them (the split
  claims its task under a row lock), and its subtasks tile its input once.
- Two watchdogs never reclaim one lease twice. Not by luck: both may act on the same silent
  executor, but a reclaim locks the executor's heartbeat row, re-checks the silence and touches
  only leases still `leased`, so the second finds nothing. The drill kills lease holders with both
  watchdogs running and checks that the leases the watchdogs report reclaimed add up to exactly
  the `lost` attempts in the database, and that each lost lease has one attempt row.
- The full audit (every record once, in order) ends the drill, for every task.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from minions.sdk import MinionsClient
from minions.testing.audit import audit
from minions.testing.balancer import HAPROXY, LONG_POLL_S, MISSING, ReplicatedServices
from minions.testing.cluster import HEARTBEAT_S, PROJECT, TEAM, Cluster, eventually, log_events, pick, sleep_records
from minions.testing.drill_executors import DrillExecutor

pytestmark = pytest.mark.skipif(HAPROXY is None, reason=MISSING)


async def _claimed_across_replicas(cluster: Cluster) -> None:
    """Executors long-poll on replicas 2 and 3; the task goes in through replica 1."""
    services = cluster.services
    assert isinstance(services, ReplicatedServices)
    stop = asyncio.Event()
    executors = [DrillExecutor(services.replica_url(i), cluster.executor_token, f"direct-{i}") for i in (2, 3)]
    runs = [asyncio.create_task(e.run(stop, wait_s=LONG_POLL_S)) for e in executors]
    try:
        async def registered() -> bool:
            return all(e.executor_id for e in executors)

        await eventually(registered, "the direct executors to register", timeout=20, interval=0.05)
        await asyncio.sleep(1.0)  # both are now inside a long-poll
        records = sleep_records(8, ms=5, prefix="x")
        async with MinionsClient(services.replica_url(1), cluster.admin_token) as via_replica_1:
            submitted = time.monotonic()
            await via_replica_1.submit({"team": TEAM, "project": PROJECT, "name": "across", "kind": "sleep",
                                        "input": {"records": records}, "subtask_size": 2})
        async def claimed() -> bool:
            return any(e.leases for e in executors)

        await eventually(claimed, "a claim on replica 2 or 3", timeout=2 * LONG_POLL_S, interval=0.01)
        first_claim_s = time.monotonic() - submitted
        await cluster.wait_finished("across", timeout=30)
    finally:
        stop.set()
        for run in runs:
            run.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
    # Woken by the NOTIFY the submit's split sent, not by the end of a 20 s long-poll.
    assert first_claim_s < LONG_POLL_S / 2, f"first claim after {first_claim_s:.1f} s"
    print(f"submitted through api-1, first claimed on another replica after {first_claim_s * 1000:.0f} ms")
    await audit(cluster, "across", records)


async def test_replicas_behind_haproxy(replicated: Cluster) -> None:
    cluster = replicated
    services = cluster.services
    assert isinstance(services, ReplicatedServices)
    await _claimed_across_replicas(cluster)

    await cluster.start_agents(pick(4, 10))
    records = sleep_records(pick(120, 1500), ms=pick(100, 60))
    await cluster.submit("replicas", records, subtask_size=2)

    # Many small tasks at once: both splitters race for each one.
    small = sleep_records(pick(12, 40), ms=1, prefix="s")
    small_names = [f"small-{i}" for i in range(pick(6, 20))]
    for name in small_names:
        await cluster.submit(name, small, subtask_size=3)

    victims: list[str] = []
    rounds = pick(1, 3)
    for r in range(rounds):
        base = r / rounds
        # kill -9 an API replica mid-task (a different one each round); it comes back later.
        await cluster.wait_progress("replicas", base + 0.2 / rounds, timeout=60)
        replica = f"api-{r % 3 + 1}"
        services.running[replica].kill()
        # Agents holding leases die too, with both watchdogs running.
        dead = await cluster.kill_holders(1, "replicas")
        victims += [token for held in dead.values() for _, token in held]
        await cluster.wait_progress("replicas", base + 0.6 / rounds, timeout=60)
        services.start(replica)
        await cluster.start_agents(1, prefix=f"spare{r}")

    await cluster.wait_finished("replicas", timeout=pick(90, 300))
    report = await audit(cluster, "replicas", records)
    print(report.summary())
    for name in small_names:
        await cluster.wait_finished(name, timeout=30)
        await audit(cluster, name, small)

    # Every lease of a killed agent was reclaimed once.
    for token in victims:
        assert await cluster.attempt_outcome(token) == ["lost"], token

    # Each task was split by exactly one splitter.
    conn = await cluster.db()
    try:
        ids = {r["name"]: str(r["id"]) for r in await conn.fetch(
            "SELECT name, id FROM tasks WHERE team = $1 AND project = $2", TEAM, PROJECT)}
        # The watchdogs' reclaims (reason: no heartbeat). A claim's answer lost with a killed replica
        # ends lost too, but by the heartbeat that does not name it, not by a watchdog.
        lost = await conn.fetchval(
            """SELECT count(*) FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
                WHERE t.team = $1 AND t.project = $2 AND a.outcome = 'lost'
                  AND a.error LIKE '%no heartbeat for%'""", TEAM, PROJECT)
    finally:
        await conn.close()
    splits: Counter[str] = Counter()
    for i in (1, 2):
        for event in log_events(services.running[f"splitter-{i}"].log(), "split_done"):
            splits[str(event["task_id"])] += 1
    twice = {name: splits[task_id] for name, task_id in ids.items() if splits[task_id] != 1}
    assert not twice, f"tasks not split exactly once: {twice}"

    # What the two watchdogs say they reclaimed is what the database recorded as lost: no lease
    # was counted by both.
    reclaimed = {i: sum(e["subtasks"] for e in log_events(services.running[f"watchdog-{i}"].log(),
                                                          "leases_reclaimed")) for i in (1, 2)}
    assert sum(reclaimed.values()) == lost, (reclaimed, lost)
    assert lost >= len(victims)
    print(f"splits per splitter-task: {dict(Counter(splits.values()))}; reclaimed by watchdog: {reclaimed}; "
          f"heartbeat {HEARTBEAT_S} s")
