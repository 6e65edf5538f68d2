"""Cluster-wide settings (lease timeout, max attempts): one home in minion_settings, set through a
checked SQL function or `minions settings`, and followed by a running API without a restart."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from minions import config, jsoncodec
from minions.db.connect import connect
from tests.support.api import running_api
from tests.support.paths import REPO


async def test_set_is_checked_and_announced(database_url: str) -> None:
    conn = await connect(database_url)
    heard: list[str] = []
    await conn.add_listener("minion_settings", lambda *args: heard.append(args[3]))
    try:
        assert await conn.fetchval("SELECT minion_lease_timeout_s()") == 120
        for key, value in (("lease_timeout_s", "0"), ("lease_timeout_s", "soon"), ("max_attempts", "0"),
                           ("max_attempts", "2.5"), ("store_signing_key", "x")):
            with pytest.raises(asyncpg.CheckViolationError):
                await conn.fetchval("SELECT minion_set_cluster_setting($1, $2)", key, value)
        assert await conn.fetchval("SELECT minion_set_cluster_setting('lease_timeout_s', '7.5')") == "7.5"
        assert await conn.fetchval("SELECT minion_set_cluster_setting('max_attempts', '5')") == "5"
        assert await conn.fetchval("SELECT minion_lease_timeout_s()") == 7.5
        assert await conn.fetchval("SELECT minion_max_attempts()") == 5
        for _ in range(50):
            if len(heard) == 2:
                break
            await asyncio.sleep(0.05)
        assert heard == ["lease_timeout_s", "max_attempts"]
    finally:
        await conn.close()


def _minions(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "MINIONS_DATABASE_URL": database_url}
    return subprocess.run([sys.executable, "-m", "minions.cli.main", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


async def test_settings_command(database_url: str) -> None:
    shown = await asyncio.to_thread(_minions, database_url, "settings", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    assert jsoncodec.loads(shown.stdout) == {"lease_timeout_s": 120, "max_attempts": 3}
    # Not above the heartbeat interval (30 s by default): refused, nothing written.
    refused = await asyncio.to_thread(_minions, database_url, "settings", "set", "lease_timeout_s", "20")
    assert refused.returncode != 0 and "heartbeat interval" in refused.stderr
    refused = await asyncio.to_thread(_minions, database_url, "settings", "set", "max_attempts", "0")
    assert refused.returncode != 0 and "max_attempts must be an integer >= 1" in refused.stderr
    done = await asyncio.to_thread(_minions, database_url, "settings", "set", "lease_timeout_s", "45")
    assert done.returncode == 0, done.stderr
    # `db migrate` applies MINIONS_MAX_ATTEMPTS, for compatibility with the environment of old.
    migrated = await asyncio.to_thread(_minions, database_url, "db", "migrate", "--max-attempts", "4")
    assert migrated.returncode == 0, migrated.stderr
    shown = await asyncio.to_thread(_minions, database_url, "settings", "show", "--json")
    assert jsoncodec.loads(shown.stdout) == {"lease_timeout_s": 45, "max_attempts": 4}


async def test_api_follows_a_change_without_restart(database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store", heartbeat_interval_s=5.0, lease_timeout_s=60.0) as api:
        async def told() -> float:
            reply = await api.call("POST", "/api/v1/executors/register", token="executor", json={
                "name": "ex-1", "hardware": {"os": "test", "device": "cpu"}, "kinds": ["sleep"],
                "models": [], "preferences": []})
            assert reply.status == 201, reply.body
            return float(reply.body["lease_timeout_s"])

        assert await told() == 60.0
        conn = await connect(database_url)
        try:
            await conn.fetchval("SELECT minion_set_cluster_setting('lease_timeout_s', '42')")
        finally:
            await conn.close()
        for _ in range(100):
            if await told() == 42.0:
                break
            await asyncio.sleep(0.1)
        assert await told() == 42.0


def test_settings_round_trip_through_the_environment() -> None:
    settings = config.Settings(database_url="postgresql://x/y", store="file:///s", port=9, sweep_interval_s=0.5,
                               lease_timeout_s=61.0)
    assert config.from_env(settings.to_env()) == settings
    splitter = config.names_for(config.SPLITTER)
    only = config.from_env(settings.to_env(splitter))
    assert (only.database_url, only.sweep_interval_s) == (settings.database_url, 0.5)
    assert only.port == config.Settings().port  # not the splitter's: not exported to it
    assert "lease_timeout_s" not in config.names_for(config.API, config.SPLITTER, config.WATCHDOG)
    assert "public_url" not in splitter  # the splitter signs no URL
    assert config.client_from_env({"MINIONS_API_URL": "http://a", "MINIONS_DATABASE_URL": "x"}) == \
        config.ClientSettings(api_url="http://a")
