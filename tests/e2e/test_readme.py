"""README's "Using it", followed verbatim: the commands are read out of README.md and run, as a new
user would in their first hour, against a real `minions up` (embedded PostgreSQL, services, one
local agent embedding with the sample model), from a folder other than the one `up` runs in."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

from minions import jsoncodec
from minions.embedded_pg import free_port
from minions.testing.waiting import eventually
from tests.support.paths import REPO


def readme_commands() -> tuple[str, list[str]]:
    """(the `minions up` line of the first terminal, the lines of the second), comments removed and
    continuation lines joined."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) >= 2, "README's Using it section lost its two command blocks"

    def lines(block: str) -> list[str]:
        joined = re.sub(r"\\\n\s*", "", block)
        return [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines() if line.strip()]

    up = lines(blocks[0])
    assert len(up) == 1 and up[0].startswith("minions up"), up
    return up[0], lines(blocks[1])


def _shell(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def _start(line: str, cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def test_readme_using_it_verbatim(tmp_path: Path) -> None:
    up_line, commands = readme_commands()
    names = [c.split()[1] if c.startswith("minions ") else c.split()[0] for c in commands]
    for expected in ("submit", "status", "wait", "results", "executors", "logs", "psql"):
        assert expected in names, f"README's Using it no longer shows `minions {expected}`"

    # `minions` on PATH, as after `pip install`, running this checkout.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "minions"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m minions.cli.main "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO),
           "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "MINIONS_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    for name in ("MINIONS_DATABASE_URL", "MINIONS_STORE", "MINIONS_API_URL", "MINIONS_TOKEN",
                 "MINIONS_ADMIN_TOKEN", "XDG_RUNTIME_DIR"):
        env.pop(name, None)
    first_terminal, second_terminal = tmp_path / "project", tmp_path / "elsewhere"
    first_terminal.mkdir()
    second_terminal.mkdir()

    up_log = tmp_path / "up.log"
    up = _start(up_line, first_terminal, env, up_log)
    try:
        async def is_up() -> bool:
            assert up.poll() is None, up_log.read_text()
            return "\nready\n" in up_log.read_text()  # its agent registered: the first submit finds it

        await eventually(is_up, "minions up", timeout_s=180, interval_s=0.5)
        outputs: dict[str, str] = {}
        for line in commands:
            result = await asyncio.to_thread(_shell, line, second_terminal, env)
            assert result.returncode == 0, f"`{line}` exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            assert "Warning" not in result.stderr, result.stderr
            assert "no online executor" not in result.stderr, result.stderr  # up was ready: its agent serves
            outputs[line.split()[1] if line.startswith("minions ") else line] = result.stdout + result.stderr

        assert "completed: 2/2 records" in outputs["submit"], outputs["submit"]
        assert re.search(r"search/ranker/emb-1\s+embedding\s+\S+\s+completed\s", outputs["status"]), outputs["status"]
        assert re.search(r"completed: 2/2 records in \d+\.\ds", outputs["wait"]), outputs["wait"]
        vectors = [jsoncodec.loads(v) for v in (second_terminal / "vectors.jsonl").read_bytes().splitlines()]
        assert [v["id"] for v in vectors] == [1, 2] and all(len(v["embedding"]) == 384 for v in vectors)
        assert "local-1" in outputs["executors"] and "embedding" in outputs["executors"], outputs["executors"]
        assert re.search(r"emb-1\s*\|\s*completed", outputs["psql"]), outputs["psql"]
        assert '"service":"api"' in outputs["logs"], outputs["logs"]

        # Re-running the README's exact submit is the same task, not a conflict.
        submit = next(c for c in commands if c.startswith("minions submit"))
        again = await asyncio.to_thread(_shell, submit, second_terminal, env)
        assert again.returncode == 0, again.stderr
        assert "submitted search/ranker/emb-1 (completed" in again.stdout, again.stdout
    finally:
        up.terminate()
        code = up.wait(120)
    assert code == 0, up_log.read_text()[-3000:]
