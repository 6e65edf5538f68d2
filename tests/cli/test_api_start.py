"""`minions api` on a database it cannot use fails at once, saying why, instead of waiting forever
(as it did in a wheel install missing its queries: the missing file read as an unreachable database)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg

from minions.embedded_pg import free_port
from tests.support import database as test_database
from tests.support.paths import REPO


def _api(database_url: str, store: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra_env}
    return subprocess.run([sys.executable, "-m", "minions.cli.main", "api", "--database-url", database_url,
                           "--store", store.as_uri(), "--port", str(free_port())],
                          env=env, capture_output=True, text=True, timeout=90, check=False)


async def test_an_unmigrated_database_is_named_not_waited_for(
        databases: test_database.TestDatabases, tmp_path: Path) -> None:
    name = f"empty_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(databases.admin_url)
    await conn.execute(f"CREATE DATABASE {name}")
    try:
        result = await asyncio.to_thread(_api, databases.url_for(name), tmp_path / "store", {})
        assert result.returncode != 0
        assert "minions db migrate" in result.stderr, result.stderr[-2000:]
    finally:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.close()


async def test_missing_queries_fail_instead_of_waiting(database_url: str, tmp_path: Path) -> None:
    empty = tmp_path / "no-schema"
    empty.mkdir()
    result = await asyncio.to_thread(_api, database_url, tmp_path / "store", {"MINIONS_SQL_DIR": str(empty)})
    assert result.returncode != 0
    assert "api.sql" in result.stderr and "waiting_for_database" not in result.stderr, result.stderr[-2000:]
