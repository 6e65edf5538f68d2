"""`minions up --db-port`: the embedded PostgreSQL listens where it is told (a deployment behind a
firewall pins it); `--executors 0` makes no executor token. A real `minions up` process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from minions import jsoncodec
from minions.embedded_pg import free_port
from minions.sdk.health import wait_until_healthy
from minions.testing.waiting import eventually
from tests.support.paths import REPO


def _env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1"}
    for name in ("MINIONS_DATABASE_URL", "MINIONS_STORE", "MINIONS_PORT", "MINIONS_ADMIN_TOKEN", "MINIONS_DB_PORT"):
        env.pop(name, None)
    return env


def _start_up(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    with (tmp_path / "up.log").open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "minions.cli.main", "up", *args], cwd=tmp_path,
                                env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def test_the_database_port_is_chosen_and_no_executors_make_no_executor_token(tmp_path: Path) -> None:
    data_dir, port, db_port = tmp_path / "data", free_port(), free_port()
    up = _start_up(tmp_path, "--data-dir", str(data_dir), "--port", str(port), "--db-port", str(db_port),
                   "--executors", "0")
    try:
        assert await wait_until_healthy(f"http://127.0.0.1:{port}", 120), (tmp_path / "up.log").read_text()

        async def up_json() -> bytes | None:  # written once everything it names is up
            path = data_dir / "up.json"
            return path.read_bytes() if path.exists() else None

        database_url = jsoncodec.loads(await eventually(up_json, "up.json"))["database_url"]
        assert f"@127.0.0.1:{db_port}/" in database_url
        conn = await asyncpg.connect(database_url)
        try:
            roles = [r["role"] for r in await conn.fetch("SELECT role FROM api_tokens")]
        finally:
            await conn.close()
        assert roles == ["admin"], roles
        assert not (data_dir / "executor.token").exists()
    finally:
        up.terminate()
        assert up.wait(60) == 0, (tmp_path / "up.log").read_text()[-3000:]


def test_a_database_port_beside_a_database_url_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "minions.cli.main", "up", "--data-dir", str(tmp_path / "data"),
                           "--db-port", "5999"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**_env(tmp_path), "MINIONS_DATABASE_URL": "postgresql://elsewhere/db"}, check=False)
    assert done.returncode != 0
    assert "--db-port" in done.stderr and "MINIONS_DATABASE_URL" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made
