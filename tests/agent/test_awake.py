"""caffeinate runs only while a lease is held, and is bound to the agent's pid."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from minions.agents.macos.awake import keep_awake


async def test_caffeinate_is_started_and_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "argv"
    fake = tmp_path / "caffeinate"  # a stand-in: records its arguments, then waits to be stopped
    fake.write_text(f'#!/bin/sh\necho "$@" > {log}\nexec sleep 30\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    async with keep_awake(system="Darwin"):
        for _ in range(100):
            if log.exists() and log.read_text():
                break
            await asyncio.sleep(0.02)
        assert log.read_text().split() == ["-i", "-w", str(os.getpid())]
        # The stand-in writes its arguments, then execs `sleep`: on a loaded machine the exec may
        # come a moment after the write.
        pids: list[str] = []
        for _ in range(100):
            pids = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).startswith("sleep 30")]
            if pids:
                break
            await asyncio.sleep(0.02)
        assert pids
    assert not any(_cmdline(p).startswith("sleep 30") for p in pids)


async def test_nothing_to_do_off_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    async with keep_awake(system="Linux"):
        pass
    async with keep_awake(system="Darwin"):  # no caffeinate binary: warn, carry on
        pass


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""
