"""Drills that take PostgreSQL away, on a server of the drill's own (never the shared one):

- restart mid-task: immediate stop, then start. Every service reconnects and LISTENs again, the
  watchdog catches up (an agent killed during the outage still has its lease reclaimed), agents
  back off meanwhile, and the task completes with no restart of anything else;
- a database down for longer: the API answers 503 with Retry-After (health included), agents back
  off, nothing crashes, and everything recovers by itself when the database returns.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp

from minions import jsoncodec
from minions.testing.audit import audit
from minions.testing.cluster import (
    Cluster,
    ClusterFactory,
    DedicatedPostgres,
    eventually,
    log_events,
    pick,
    sleep_records,
)


def _assert_all_alive(cluster: Cluster, *, agents: bool = True) -> None:
    """No service (and, unless the drill killed some, no agent) has exited."""
    dead = {n: s.process.poll() for n, s in cluster.services.running.items()
            if s.process and s.process.poll() is not None}
    if agents:
        dead |= {a.name: a.process.poll() for a in cluster.fleet.agents if a.process.poll() is not None}
    assert not dead, f"processes exited: {dead}\n{cluster.logs()}"


async def test_postgres_restart_mid_task(dedicated_pg: tuple[DedicatedPostgres, str],
                                         make_cluster: ClusterFactory) -> None:
    pg, url = dedicated_pg
    cluster: Cluster = await make_cluster(url)
    await cluster.services.start_all()
    agents = await cluster.start_agents(pick(4, 8))
    records = sleep_records(pick(80, 400), ms=pick(100, 60))
    await cluster.submit("restart", records, subtask_size=2)
    pids = {n: s.process.pid for n, s in cluster.services.running.items() if s.process}
    restarts = pick([0.3], [0.2, 0.45, 0.7])
    victims: dict[str, list[tuple[int, str]]] = {}
    for mark in restarts:
        await cluster.wait_progress("restart", mark, timeout=60)
        holders = await cluster.holders("restart")
        pg.stop("immediate")
        # An agent dies while the database is away: nobody can notice until it returns.
        alive = [a.name for a in cluster.alive_agents() if a.name in holders]
        if alive and len(victims) < len(agents) // 2:
            cluster.agent(alive[0]).kill()
            victims[alive[0]] = holders[alive[0]]
        await asyncio.sleep(pick(1.0, 3.0))
        restarted_at = datetime.now(UTC)
        pg.restart()

    await cluster.wait_finished("restart", timeout=pick(60, 180))
    report = await audit(cluster, "restart", records)
    print(report.summary())
    # Nothing was restarted but PostgreSQL, and each service LISTENs again.
    assert {n: s.process.pid for n, s in cluster.services.running.items() if s.process} == pids
    _assert_all_alive(cluster, agents=False)
    assert any(log_events(a.log(), "api_retry") for a in cluster.alive_agents()), "no agent saw the outage"
    # Each service LISTENs again after the last restart. Not once per restart: a listener still in
    # its backoff after one outage when the next begins reconnects once for both.
    for name in ("api", "splitter", "watchdog"):
        listening = log_events(cluster.services.running[name].log(), "listening")
        again = [e for e in listening if e.get("reconnect")
                 and datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")) > restarted_at]
        assert again, f"{name} did not LISTEN again after the last restart: {listening}"
    for name, held in victims.items():
        for _, token in held:
            assert await cluster.attempt_outcome(token) in (["lost"], ["done"]), name
    # The splitter serves new work after the restart too, and the surviving agents run it.
    more = sleep_records(10, ms=1, prefix="after")
    await cluster.submit("after-restart", more, subtask_size=3)
    await cluster.wait_finished("after-restart", timeout=30)
    await audit(cluster, "after-restart", more)


async def test_database_down_503_backoff_and_recovery(dedicated_pg: tuple[DedicatedPostgres, str],
                                                      make_cluster: ClusterFactory) -> None:
    pg, url = dedicated_pg
    cluster: Cluster = await make_cluster(url)
    await cluster.services.start_all()
    await cluster.start_agents(pick(3, 8))
    records = sleep_records(pick(40, 200), ms=pick(100, 60))
    await cluster.submit("through-outage", records, subtask_size=2)
    await cluster.wait_progress("through-outage", 0.25, timeout=60)
    executor_id = (await cluster.client.executors())[0]["id"]

    pg.stop("immediate")
    down_at = time.monotonic()
    outage_s = pick(5.0, 20.0)
    api = cluster.services.api_url
    admin = {"Authorization": f"Bearer {cluster.admin_token}"}
    executor = {"Authorization": f"Bearer {cluster.executor_token}"}
    probes: list[tuple[str, str, dict[str, str], dict[str, Any] | None]] = [
        ("GET", "/api/v1/health", {}, None),
        ("GET", "/api/v1/tasks/chaos/drill/through-outage", admin, None),
        ("POST", "/api/v1/tasks", admin, {"team": "chaos", "project": "drill", "name": "refused",
                                          "kind": "sleep", "input": {"records": [{"id": 1, "ms": 1}]}}),
        ("POST", f"/api/v1/executors/{executor_id}/claim?wait=1", executor, None),
        ("POST", f"/api/v1/executors/{executor_id}/heartbeat", executor, {"leases": []}),
    ]
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - down_at < outage_s:
            for method, path, headers, body in probes:
                async with session.request(method, api + path, headers=headers, json=body) as resp:
                    raw = await resp.read()
                    assert resp.status == 503, (method, path, resp.status, raw[:300])
                    assert int(resp.headers["Retry-After"]) >= 1, (path, dict(resp.headers))
                    assert jsoncodec.loads(raw)["error"]["code"] == "database_unavailable", raw
            _assert_all_alive(cluster)
            await asyncio.sleep(0.5)

    # The agents backed off: a handful of retries each, spaced ever wider, not a hammering.
    for agent in cluster.fleet.agents:
        retries = log_events(agent.log(), "api_retry")
        assert retries, f"{agent.name} never noticed the outage"
        assert len(retries) <= 4 * outage_s, f"{agent.name} retried {len(retries)} times in {outage_s} s"
        waits = [e["retry_in_s"] for e in retries]
        assert max(waits) >= 1.0, f"{agent.name} did not back off: {waits}"

    pg.restart()

    async def healthy() -> bool:
        async with aiohttp.ClientSession() as session, session.get(f"{api}/api/v1/health") as resp:
            return resp.status == 200

    await eventually(healthy, "the API to report the database back", timeout=15)
    _assert_all_alive(cluster)
    await cluster.wait_finished("through-outage", timeout=60)
    report = await audit(cluster, "through-outage", records)
    print(report.summary())
    more = sleep_records(12, ms=1, prefix="after")
    await cluster.submit("after-outage", more, subtask_size=2)
    await cluster.wait_finished("after-outage", timeout=40)
    await audit(cluster, "after-outage", more)
    _assert_all_alive(cluster)
