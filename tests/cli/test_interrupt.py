"""Ctrl-C while waiting stops the waiting, not the task: `minions wait` in a terminal (a pty) says
so in one line, with how to wait again or cancel, and exits 130 without a traceback; the SDK's
blocking `wait` raises a KeyboardInterrupt that says the same."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

from tests.cli.conftest import Cli


def _read_until(fd: int, wanted: bytes, limit_s: float = 60.0) -> bytes:
    """What the pty shows until `wanted` appears (or the child ends, or `limit_s` passes)."""
    seen = b""
    deadline = time.monotonic() + limit_s
    while wanted not in seen and time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    return seen


def _wait_in_a_pty(cli: Cli, ref: str) -> tuple[int, str]:
    """`minions wait REF` on a terminal; Ctrl-C (SIGINT to its process group, as the terminal
    sends it) once its progress bar shows; its exit status and all it wrote."""
    master, slave = os.openpty()
    process = subprocess.Popen([sys.executable, "-m", "minions.cli.main", "wait", ref, "--interval", "0.1"],
                               cwd=cli.cwd, env={**cli.env(), "TERM": "xterm", "COLUMNS": "120"},
                               stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    try:
        shown = _read_until(master, ref.encode())
        assert ref.encode() in shown, shown.decode(errors="replace")
        os.killpg(process.pid, signal.SIGINT)
        shown += _read_until(master, b"\0")  # to the end of its output
        return process.wait(timeout=60), shown.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)


async def test_ctrl_c_in_wait_exits_130_and_says_how_to_go_on(cli: Cli) -> None:
    (cli.cwd / "r.jsonl").write_text('{"id": 1, "ms": 1}\n')
    submitted = await cli.run("submit", "r.jsonl", "--team", "search", "--project", "ranker", "--name", "w-1",
                              "--kind", "sleep")
    assert submitted.returncode == 0, submitted.stderr  # no executor: it stays queued
    code, output = await asyncio.to_thread(_wait_in_a_pty, cli, "search/ranker/w-1")
    assert code == 130, output
    assert "Traceback" not in output and "CancelledError" not in output, output
    assert "search/ranker/w-1 keeps running" in output, output
    assert "`minions wait search/ranker/w-1`" in output and "`minions cancel search/ranker/w-1`" in output, output
    status, task = await cli.get("/api/v1/tasks/search/ranker/w-1")
    assert status == 200 and isinstance(task, dict) and task["status"] in ("submitted", "queued"), task


_SDK_WAIT = """
import sys
from minions.sdk import SyncMinionsClient, WaitInterrupted

with SyncMinionsClient(sys.argv[1], sys.argv[2]) as client:
    original = client._client.task

    async def task(*args):
        result = await original(*args)
        print("polled", flush=True)
        return result

    client._client.task = task
    try:
        client.wait("search/ranker/w-2", interval_s=0.05)
    except WaitInterrupted as exc:
        client._client.task = original
        print("interrupted:", isinstance(exc, KeyboardInterrupt), exc, flush=True)
        print("then:", client.get_task("search/ranker/w-2").status, flush=True)
"""


async def test_the_sdk_wait_interrupted_says_the_task_keeps_running(cli: Cli) -> None:
    """SIGINT to a script blocked in the SDK's `wait`: a KeyboardInterrupt, as a notebook's interrupt
    is, whose message says how to go on; the client still works after it."""
    (cli.cwd / "r.jsonl").write_text('{"id": 1, "ms": 1}\n')
    assert (await cli.run("submit", "r.jsonl", "--team", "search", "--project", "ranker", "--name", "w-2",
                          "--kind", "sleep")).returncode == 0

    def run() -> tuple[int, str, str]:
        process = subprocess.Popen([sys.executable, "-c", _SDK_WAIT, cli.services.api_url, cli.admin],
                                   cwd=cli.cwd, env=cli.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        assert process.stdout is not None
        try:
            assert process.stdout.readline().strip() == "polled"
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        return process.returncode, out, err

    code, out, err = await asyncio.to_thread(run)
    assert code == 0, err
    assert "Traceback" not in err, err
    assert "interrupted: True stopped waiting for search/ranker/w-2; the task keeps running" in out, out
    assert "client.cancel('search/ranker/w-2')" in out, out
    assert "then: queued" in out or "then: submitted" in out, out


async def test_a_true_warning_is_said_once_however_long_the_wait(cli: Cli) -> None:
    """`submit --wait` of a task no executor serves: the warning once (not again from the wait, nor
    at every poll), while the progress lines go on until the task ends (here: cancelled)."""
    (cli.cwd / "t.jsonl").write_text('{"id": 1, "text": "hello"}\n')
    process = _start(cli, "submit", "t.jsonl", "--team", "search", "--project", "ranker", "--name", "w-3",
                     "--kind", "embedding", "--model", "no/such-model", "--wait")
    assert process.stderr is not None
    try:
        seen: list[str] = []
        while not any("search/ranker/w-3 [" in line for line in seen):  # its first progress line
            line = process.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
        for _ in range(2):  # meanwhile the wait polls on (every 0.5 s), the warning still in each answer
            status = await cli.run("status", "search/ranker/w-3")
            assert "warning: no online executor" in status.stdout, status.stdout
        cancelled = await cli.run("cancel", "search/ranker/w-3")
        assert cancelled.returncode == 0, cancelled.stderr
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    said = "".join(seen) + err
    assert said.count("warning: no online executor serves embedding with model no/such-model") == 1, said
    assert process.returncode == 1 and "cancelled" in out, out


def _start(cli: Cli, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "minions.cli.main", *args], cwd=cli.cwd, env=cli.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
