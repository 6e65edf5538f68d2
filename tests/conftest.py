"""Shared fixtures: a real PostgreSQL (embedded, or MINIONS_TEST_DATABASE_URL) with a fresh migrated
database per test."""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

import minions
from minions.testing.processes import Services
from tests.support.database import TestDatabases

os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")

# The folders pyproject.toml's package-dir maps into the package.
MAPPED = ("minions.services", "minions.agents", "minions.sql", "minions.infra")


def pytest_configure(config: pytest.Config) -> None:
    """One checkout's code, or no run: an editable install maps the package-dir folders to the
    checkout it was made from, so a venv made in one worktree and run in another would test this
    minions/ with the other's services/ and agents/ (and a venv installed before package-dir finds
    no minions.services at all)."""
    root = Path(minions.__file__).resolve().parent.parent
    strays = []
    for name in MAPPED:
        try:
            where = Path(str(importlib.import_module(name).__file__)).resolve()
        except ModuleNotFoundError:
            strays.append(f"no {name}")
            continue
        if not where.is_relative_to(root):
            strays.append(f"{name} from {where}")
    if strays:
        raise pytest.UsageError(f"minions is {root}'s, but " + ", ".join(strays) +
                                f": install this checkout into the venv (`make install` in {root})")


@pytest.fixture(scope="session")
def databases() -> Iterator[TestDatabases]:
    dbs = TestDatabases()
    yield dbs
    dbs.stop()


@pytest_asyncio.fixture(scope="session")
async def template_ready(databases: TestDatabases) -> AsyncIterator[TestDatabases]:
    await databases.prepare_template()
    yield databases


@pytest_asyncio.fixture
async def database_url(template_ready: TestDatabases) -> AsyncIterator[str]:
    """A fresh database with the whole schema, for this test alone (dropped once the test is over)."""
    url = await template_ready.fresh()
    yield url
    template_ready.finished(url)


@pytest_asyncio.fixture
async def services(database_url: str, tmp_path: Path) -> AsyncIterator[Services]:
    """API, splitter and watchdog as real processes on this test's database (started by the test,
    so it can choose which and when); all stopped at the end."""
    svc = Services(database_url, tmp_path / "services")
    try:
        yield svc
    finally:
        svc.stop_all()
