"""The logs of `minions up`: each child's output goes to a file that rotates by size (owner-only,
whole lines), and `minions logs [SERVICE] [-f]` shows them, following a log through its rotation."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from minions.cli.child_logs import ChildLog, pump
from minions.cli.supervisor import Supervisor
from tests.support.paths import REPO


async def test_a_child_log_rotates_by_size_and_keeps_whole_lines(tmp_path: Path) -> None:
    log = ChildLog(tmp_path / "api.log", max_bytes=4000, backups=2)
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "for i in range(1000): print(f'line {i:04d} ' + 'x' * 40)\nprint('end', end='')",
        stdout=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    await pump(child.stdout, log)
    await child.wait()
    log.close()
    _check_rotated(tmp_path)


def _check_rotated(folder: Path) -> None:
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["api.log", "api.log.1", "api.log.2"]  # older ones dropped
    for path in folder.iterdir():
        assert path.stat().st_size <= 4000
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert all(line.startswith(("line ", "end")) and len(line) in (50, 3)
                   for line in path.read_text().splitlines())
    assert (folder / "api.log").read_text().endswith("line 0999 " + "x" * 40 + "\nend\n")


async def test_the_supervisor_writes_a_childs_output_to_its_log(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path)
    child = await supervisor.start("zen", "this", [], {})  # prints the Zen of Python and exits
    assert child.process is not None
    await child.process.wait()
    await supervisor.stop()
    assert "Beautiful is better than ugly." in (tmp_path / "zen.log").read_text()


def _minions(*args: str, **kwargs: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "minions.cli.main", "logs", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


def test_minions_logs_shows_the_last_lines_of_each_log(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "api.log").write_text("".join(f"api {i}\n" for i in range(100)))
    (logs / "splitter.log").write_text("split 1\nsplit 2\n")
    every = _minions("--data-dir", str(tmp_path), "-n", "2")
    out, err = every.communicate(timeout=30)
    assert every.returncode == 0, err
    assert out.decode() == "==> api <==\napi 98\napi 99\n==> splitter <==\nsplit 1\nsplit 2\n"
    unknown = _minions("--data-dir", str(tmp_path), "agent-9")
    out, err = unknown.communicate(timeout=30)
    assert unknown.returncode == 1 and b"no log named 'agent-9'" in err and b"api, splitter" in err


def test_minions_logs_follow_goes_through_a_rotation(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    api = logs / "api.log"
    api.write_text("old\n")
    follow = _minions("--data-dir", str(tmp_path), "api", "-f", "-n", "1")
    assert follow.stdout is not None
    try:
        assert follow.stdout.readline() == b"old\n"
        time.sleep(0.5)  # it follows now
        with api.open("a") as f:
            f.write("before rotation\n")
        api.rename(logs / "api.log.1")
        api.write_text("after rotation\n")
        assert follow.stdout.readline() == b"before rotation\n"
        assert follow.stdout.readline() == b"after rotation\n"
    finally:
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=30)
    assert follow.returncode == 0 and b"Traceback" not in err
