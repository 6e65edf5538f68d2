"""`minions up` says `ready` only once its local agents have registered, each with what it serves,
so a task submitted right after it finds its executor: no "no online executor serves" warning. A
real `minions up` with a local agent (the sleep kind: no model to download)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from minions import jsoncodec
from minions.embedded_pg import free_port
from tests.support.paths import REPO


def _up(cwd: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "minions.cli.main", "up", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)


def _lines_until(process: subprocess.Popen[str], wanted: str, limit_s: float = 240.0) -> list[str]:
    """Its output lines up to and including `wanted` (all of them if it ends or `limit_s` passes)."""
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if lines[-1] == wanted:
            break
    return lines


async def test_up_is_ready_once_its_agent_registered_and_the_first_submit_does_not_warn(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1",
           "MINIONS_API_WORKERS": "1"}
    for name in ("MINIONS_DATABASE_URL", "MINIONS_STORE", "MINIONS_PORT", "MINIONS_ADMIN_TOKEN", "MINIONS_TOKEN",
                 "MINIONS_API_URL"):
        env.pop(name, None)
    data_dir = tmp_path / "data"
    up = _up(tmp_path, env, "--data-dir", str(data_dir), "--port", str(free_port()), "--executors", "1",
             "--executor-arg=--kind=sleep")
    try:
        lines = await asyncio.to_thread(_lines_until, up, "ready")
        assert lines and lines[-1] == "ready", "\n".join(lines)
        agent_line = next((line for line in lines if line.strip().startswith("local-1: ")), None)
        assert agent_line is not None, "\n".join(lines)
        assert agent_line.strip() in ("local-1: cpu; kinds: sleep", "local-1: cuda; kinds: sleep",
                                      "local-1: mps; kinds: sleep"), agent_line
        assert lines.index(agent_line) > next(i for i, line in enumerate(lines) if "waiting for 1 local agent" in line)
        # The banner names the database without its superuser's password (up.json, owner-only, has it).
        info = jsoncodec.loads((data_dir / "up.json").read_bytes())
        [database] = [line for line in lines if line.strip().startswith("database:")]
        assert "[redacted]@" in database and info["database_url"].split("@")[0].split(":")[-1] not in database

        (tmp_path / "r.jsonl").write_text('{"id": 1, "ms": 1}\n')
        submitted = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "minions.cli.main", "submit", "r.jsonl", "--team", "t",
                             "--project", "p", "--name", "first", "--kind", "sleep", "--data-dir", str(data_dir),
                             "--wait"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert submitted.returncode == 0, submitted.stderr
        assert "no online executor" not in submitted.stderr, submitted.stderr
        assert "completed: 1/1 records" in submitted.stdout, submitted.stdout
    finally:
        up.terminate()
        await asyncio.to_thread(up.communicate, timeout=120)


async def test_up_stops_saying_why_when_its_agent_exits_before_it_registers(tmp_path: Path) -> None:
    """An agent that cannot start (here an argument it does not know) is restarted by the supervisor
    forever; `up` must not wait for it forever: after a few exits it quotes the agent's log and stops."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONUNBUFFERED": "1",
           "MINIONS_API_WORKERS": "1"}
    for name in ("MINIONS_DATABASE_URL", "MINIONS_STORE", "MINIONS_PORT", "MINIONS_ADMIN_TOKEN", "MINIONS_TOKEN",
                 "MINIONS_API_URL"):
        env.pop(name, None)
    up = _up(tmp_path, env, "--data-dir", str(tmp_path / "data"), "--port", str(free_port()), "--executors", "1",
             "--executor-arg=--no-such-flag")
    try:
        output, _ = await asyncio.to_thread(up.communicate, timeout=180)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 1, output
    assert "local-1 exited 3 times before it registered (last exit status 2)" in output, output
    assert "--no-such-flag" in output, output  # the agent's own complaint, quoted from its log
    assert "ready" not in output.splitlines(), output
    assert "stopping ..." in output, output  # the services it started are stopped in order
