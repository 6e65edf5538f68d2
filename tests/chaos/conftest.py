"""Chaos drill fixtures: a cluster of real processes on a fresh database of the shared test server,
or (for drills that stop PostgreSQL) on a dedicated server of the drill's own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import pytest

from minions.testing.agents import AgentFleet
from minions.testing.balancer import LONG_POLL_S, ReplicatedServices
from minions.testing.cluster import HEARTBEAT_S, LEASE_TIMEOUT_S, Cluster, ClusterFactory, DedicatedPostgres
from minions.testing.factories import make_tokens

_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


@pytest.fixture
async def make_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    """`await make_cluster(database_url, **Services settings)`: the services are not started yet.
    On teardown every process is stopped; when the drill failed, their logs are printed."""
    made: list[Cluster] = []

    async def factory(database_url: str, **settings: Any) -> Cluster:
        cluster = await Cluster.create(database_url, tmp_path / f"cluster-{len(made)}", **settings)
        made.append(cluster)
        return cluster

    try:
        yield factory
    finally:
        for cluster in made:
            if request.node.stash.get(_FAILED, False):
                print(cluster.logs())
            await cluster.close()


@pytest.fixture
async def cluster(make_cluster: ClusterFactory, database_url: str) -> Cluster:
    """Services running against a fresh database of the shared server; no agents yet."""
    c: Cluster = await make_cluster(database_url)
    await c.services.start_all()
    return c


@pytest.fixture
async def dedicated_pg() -> AsyncIterator[tuple[DedicatedPostgres, str]]:
    pg = DedicatedPostgres()
    try:
        url = await pg.start()
        yield pg, url
    finally:
        pg.close()


@pytest.fixture
async def replicated(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    """Three API replicas behind HAProxy, two splitters, two watchdogs (tests/chaos/balancer.py)."""
    admin, executor = await make_tokens(database_url)
    services = ReplicatedServices(database_url, tmp_path / "replicas", heartbeat_interval_s=HEARTBEAT_S,
                                  lease_timeout_s=LEASE_TIMEOUT_S, long_poll_s=LONG_POLL_S)
    # Every task through the splitters (none split at submission): the drill races two of them.
    services.split_at_submit = False
    cluster = Cluster(services, AgentFleet(services, executor), admin, executor)
    try:
        await services.start_all()
        yield cluster
    finally:
        if request.node.stash.get(_FAILED, False):
            print(cluster.logs())
        await cluster.close()
