"""What `minions up` and the services write to disk (the local store's inputs,
results and temporary uploads; the logs) is for their user alone: 0700 folders, 0600 files, like
pg/, up.json and the tokens. Run with a permissive umask (022), as a user's shell has it, so that
only explicit modes or the umask `minions up` sets can pass."""

from __future__ import annotations

import asyncio
import os
import plistlib
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from minions import jsoncodec
from minions.agents.macos.install import render_launchd, render_systemd
from minions.db.connect import connect
from minions.embedded_pg import free_port
from minions.testing.factories import make_token
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually
from tests.support.paths import REPO


@pytest.fixture
def shell_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _open_to_others(root: Path) -> list[str]:
    """Every folder or file under `root` (itself included) that its group or others may touch."""
    found = []
    for folder, dirs, files in os.walk(root):
        for path in [Path(folder)] + [Path(folder) / name for name in files]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            if mode & 0o077:
                found.append(f"{oct(mode)} {path.relative_to(root)}")
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
    return found


async def _slow_body(first: bytes, rest: bytes, sent: asyncio.Event, go_on: asyncio.Event) -> AsyncIterator[bytes]:
    yield first
    sent.set()
    await go_on.wait()
    yield rest


async def test_minions_up_keeps_the_store_and_logs_to_their_owner(database_url: str, tmp_path: Path,
                                                                  shell_umask: None) -> None:
    data_dir = tmp_path / "data"
    output = tmp_path / "up.out"
    up = _start_up(database_url, data_dir, output)
    try:
        async def up_json() -> dict[str, str] | None:
            assert up.poll() is None, output.read_text()
            path = data_dir / "up.json"
            return jsoncodec.loads(path.read_bytes()) if path.exists() else None

        info = await eventually(up_json, "minions up to write up.json", timeout_s=90)
        api, admin = info["api_url"], info["admin_token"]
        headers = {"Authorization": f"Bearer {admin}"}
        async with aiohttp.ClientSession() as http:
            # An uploaded input, held half-way so its temporary file can be seen.
            sent, go_on = asyncio.Event(), asyncio.Event()
            body = _slow_body(b'{"id": "a", "ms": 1}\n', b'{"id": "b", "ms": 1}\n', sent, go_on)
            upload = asyncio.create_task(http.post(f"{api}/api/v1/inputs", data=body, headers={
                **headers, "Content-Type": "application/x-ndjson"}))
            await sent.wait()
            store = data_dir / "store"
            tmp_files = await eventually(lambda: _now(list(store.rglob("*.tmp"))), "the upload's temp file")
            tmp_modes = {str(p.relative_to(store)): oct(stat.S_IMODE(p.stat().st_mode)) for p in tmp_files}
            go_on.set()
            async with await upload as resp:
                assert resp.status == 201, await resp.text()
                uri = (await resp.json())["uri"]
            for name, records in (("uploaded", {"uri": uri}),
                                  ("inline", {"records": [{"id": "c", "ms": 1}, {"id": "d", "ms": 1}]})):
                async with http.post(f"{api}/api/v1/tasks", headers=headers, json={
                        "team": "search", "project": "modes", "name": name, "kind": "sleep",
                        "input": records, "subtask_size": 1}) as resp:
                    assert resp.status == 201, await resp.text()
        # Results, written through the store's signed PUT URLs by an executor (`up` without local
        # agents makes no executor token: one is made here).
        conn = await connect(database_url)
        try:
            executor_token, _ = await make_token(conn, "executor")
        finally:
            await conn.close()
        executor = SleepExecutor(api, executor_token, "modes-executor")
        stop = asyncio.Event()
        runner = asyncio.create_task(executor.run(stop, wait_s=1))
        await eventually(lambda: _now(len(executor.completed) >= 4), "four subtasks done", timeout_s=60)
        stop.set()
        await runner
        assert all(mode == "0o600" for mode in tmp_modes.values()), f"temporary uploads: {tmp_modes}"
        open_files = _open_to_others(data_dir)
        assert open_files == [], "readable by others:\n" + "\n".join(open_files)
        assert any((data_dir / "logs").glob("*.log")) and any(store.rglob("*.jsonl"))
    finally:
        await asyncio.to_thread(_stop, up)


def _start_up(database_url: str, data_dir: Path, output: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MINIONS_DATABASE_URL": database_url, "PYTHONUNBUFFERED": "1"}
    with output.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "minions.cli.main", "up", "--data-dir", str(data_dir),
                                 "--port", str(free_port()), "--host", "127.0.0.1"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop(up: subprocess.Popen[bytes]) -> None:
    up.send_signal(signal.SIGINT)
    try:
        up.wait(60)
    except subprocess.TimeoutExpired:
        up.kill()
        up.wait(10)


async def _now(value: object) -> object:
    """A value already at hand, as `eventually` wants it (a coroutine)."""
    return value


def test_the_installed_agent_writes_owner_only_logs(tmp_path: Path) -> None:
    plist = plistlib.loads(render_launchd(tmp_path / "agent.toml", home=tmp_path).encode())
    # launchd creates StandardOutPath/StandardErrorPath with the job's umask.
    assert plist["Umask"] == 0o077
    assert "UMask=0077" in render_systemd(tmp_path / "agent.toml").splitlines()
