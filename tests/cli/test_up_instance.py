"""One `minions up` per data dir: a second one on the same data dir, or on a port in use, says who
is in the way, exits non-zero, and leaves the first one untouched. Real `minions up` processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp

from minions import jsoncodec
from minions.embedded_pg import free_port
from minions.sdk.health import wait_until_healthy
from minions.testing.waiting import eventually
from tests.support.paths import REPO


def _up(data_dir: Path, port: int, cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(cwd / "state"), "PYTHONUNBUFFERED": "1"}
    for name in ("MINIONS_DATABASE_URL", "MINIONS_STORE", "MINIONS_PORT", "MINIONS_ADMIN_TOKEN"):
        env.pop(name, None)
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "minions.cli.main", "up", "--data-dir", str(data_dir),
                                 "--port", str(port)], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


async def _tasks_status(api_url: str, token: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(
            f"{api_url}/api/v1/tasks", headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status


async def test_a_second_up_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    port = free_port()
    first = _up(data_dir, port, tmp_path, tmp_path / "first.log")
    try:
        api_url = f"http://127.0.0.1:{port}"
        assert await wait_until_healthy(api_url, 120), (tmp_path / "first.log").read_text()
        async def up_json() -> bytes | None:
            path = data_dir / "up.json"
            return path.read_bytes() if path.exists() else None

        token = jsoncodec.loads(await eventually(up_json, "up.json"))["admin_token"]
        pg_files = sorted(p.name for p in (data_dir / "pg").iterdir())

        # The same data dir, another port: refused before it starts anything.
        other_port = free_port()
        second = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "minions.cli.main", "up", "--data-dir", str(data_dir), "--port", str(other_port)],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
            check=False)
        assert second.returncode != 0
        assert f"pid {first.pid}" in second.stderr and api_url in second.stderr, second.stderr
        assert "Minions is up" not in second.stdout

        # Another data dir on the first one's port: refused too, naming the port.
        third = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "minions.cli.main", "up", "--data-dir", str(tmp_path / "other"), "--port",
             str(port)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
            text=True, timeout=60, check=False)
        assert third.returncode != 0
        assert f"port {port}" in third.stderr and "in use" in third.stderr, third.stderr
        assert not (tmp_path / "other" / "pg").exists()  # nothing was started for it

        # The first is untouched: its API and its PostgreSQL still answer.
        assert first.poll() is None
        assert await _tasks_status(api_url, token) == 200
        assert sorted(p.name for p in (data_dir / "pg").iterdir()) == pg_files
        assert "restarting" not in (tmp_path / "first.log").read_text()
    finally:
        first.terminate()
        assert first.wait(60) == 0
    # Once it stopped, the data dir is free again.
    port = free_port()
    again = _up(data_dir, port, tmp_path, tmp_path / "again.log")
    try:
        assert await wait_until_healthy(f"http://127.0.0.1:{port}", 120), (tmp_path / "again.log").read_text()
    finally:
        again.terminate()
        assert again.wait(60) == 0
