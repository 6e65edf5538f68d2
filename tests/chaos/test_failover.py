"""Drill: the primary PostgreSQL dies mid-task and a synchronous streaming standby takes over.

Services get one multi-host MINIONS_DATABASE_URL (`host1:port1,host2:port2/...?
target_session_attrs=read-write`), passed to asyncpg as is: before the failover only the primary
accepts them (the standby is read-only), after it only the promoted standby. Nothing else is told
about the failover: no service or agent is restarted. Each service reconnects and LISTENs again,
the watchdog catches up, and the task completes with nothing lost (every subtask committed before
the failover is still committed after it: synchronous commit) and nothing committed twice (the
audit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from minions.testing.audit import audit
from minions.testing.cluster import Cluster, ClusterFactory, log_events, pick, sleep_records
from tests.chaos.standby import PrimaryAndStandby


@pytest.fixture
async def replicated_pg() -> AsyncIterator[tuple[PrimaryAndStandby, str]]:
    pair = PrimaryAndStandby()
    try:
        url = await pair.start()
        yield pair, url
    finally:
        pair.close()


async def _done_subtasks(cluster: Cluster, name: str) -> set[int]:
    conn = await cluster.db()
    try:
        rows = await conn.fetch(
            """SELECT s.subtask_id FROM subtasks s JOIN tasks t ON t.id = s.task_id
                WHERE t.name = $1 AND s.state = 'done'""", name)
    finally:
        await conn.close()
    return {r["subtask_id"] for r in rows}


async def test_standby_takes_over_mid_task(replicated_pg: tuple[PrimaryAndStandby, str],
                                           make_cluster: ClusterFactory) -> None:
    pair, url = replicated_pg
    cluster: Cluster = await make_cluster(url)
    await cluster.services.start_all()
    await cluster.start_agents(pick(4, 8))
    records = sleep_records(pick(80, 600), ms=pick(100, 60))
    await cluster.submit("failover", records, subtask_size=2)
    pids = {n: s.process.pid for n, s in cluster.services.running.items() if s.process}
    assert await pair.sync_state() == "sync", "the standby is not synchronous"

    await cluster.wait_progress("failover", 0.3, timeout=60)
    committed_before = await _done_subtasks(cluster, "failover")
    pair.fail_over()

    # Nothing acknowledged before the primary died is missing on the promoted standby.
    committed_after = await _done_subtasks(cluster, "failover")
    assert committed_before <= committed_after, sorted(committed_before - committed_after)

    await cluster.wait_finished("failover", timeout=pick(90, 300))
    report = await audit(cluster, "failover", records)
    print(f"{report.summary()}; {len(committed_before)} subtasks committed before the failover")
    assert {n: s.process.pid for n, s in cluster.services.running.items() if s.process} == pids
    for name in ("api", "splitter", "watchdog"):
        listening = log_events(cluster.services.running[name].log(), "listening")
        assert len(listening) >= 2, f"{name} did not LISTEN again on the new primary: {listening}"

    # New work after the failover: split, claimed and committed on the promoted standby.
    more = sleep_records(10, ms=1, prefix="after")
    await cluster.submit("after-failover", more, subtask_size=3)
    await cluster.wait_finished("after-failover", timeout=40)
    await audit(cluster, "after-failover", more)
