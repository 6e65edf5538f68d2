"""Runs the services and local agents of `minions up` as child processes: each logs to its own file
(rotated by size, minions/cli/child_logs.py), a child that dies is restarted with backoff, and
stop() ends them all (SIGTERM, then SIGKILL).

The backoff is for crash loops only: a child that ran for `healthy_s` before it died is restarted at
once, and its next quick crash waits the first delay again, not the longest one it ever reached."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from minions.cli.child_logs import BACKUPS, MAX_BYTES, ChildLog, pump
from minions.logging import get_logger
from minions.private_files import DIR_MODE, make_private_dir, tighten

log = get_logger(__name__)


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    last_code: int | None = None  # the exit status of its latest death (None: it has not died)
    started_at: float = 0.0  # time.monotonic() of the latest spawn
    stopping: bool = False
    log: ChildLog | None = field(default=None, repr=False)
    pump: asyncio.Task[None] | None = field(default=None, repr=False)  # output -> log, until EOF
    pass_fds: tuple[int, ...] = ()  # descriptors the child inherits (the API's listening socket)


class Supervisor:
    def __init__(self, log_dir: Path, *, first_restart_s: float = 1.0, max_restart_s: float = 30.0,
                 healthy_s: float = 60.0, log_max_bytes: int = MAX_BYTES, log_backups: int = BACKUPS) -> None:
        self.log_dir = log_dir
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.first_restart_s = first_restart_s
        self.max_restart_s = max_restart_s
        self.healthy_s = healthy_s
        self.children: dict[str, Child] = {}
        self._stopping = False
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self, name: str, module: str, args: list[str], env: dict[str, str],
                    pass_fds: tuple[int, ...] = ()) -> Child:
        # Logs name tasks, teams and errors: owner-only, like the data dir around them.
        make_private_dir(self.log_dir)
        tighten(self.log_dir, DIR_MODE)
        child = Child(name, [sys.executable, "-m", module, *args], {**os.environ, **env},
                      self.log_dir / f"{name}.log", pass_fds=pass_fds)
        child.log = ChildLog(child.log_path, self.log_max_bytes, self.log_backups)
        self.children[name] = child
        await self._spawn(child)
        self._watchers.append(asyncio.create_task(self._watch(child), name=f"watch-{name}"))
        return child

    async def _spawn(self, child: Child) -> None:
        child.started_at = time.monotonic()
        child.process = await asyncio.create_subprocess_exec(
            *child.argv, env=child.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True, pass_fds=child.pass_fds,
            limit=1 << 20,
        )
        assert child.process.stdout is not None and child.log is not None
        child.pump = asyncio.create_task(pump(child.process.stdout, child.log), name=f"log-{child.name}")

    async def _watch(self, child: Child) -> None:
        delay = self.first_restart_s  # the wait before the next restart of a crash loop
        while True:
            assert child.process is not None
            code = await child.process.wait()
            ran_s = time.monotonic() - child.started_at
            child.last_code = code
            await self._drain(child)
            if self._stopping or child.stopping:
                return
            child.restarts += 1
            if ran_s >= self.healthy_s:
                # It ran well for a while: a crash now is news, not a loop. Restart at once, and
                # start the backoff over for the crashes that may follow.
                wait, delay = 0.0, self.first_restart_s
            else:
                wait, delay = delay, min(delay * 2, self.max_restart_s)
            log.warning("child_exited", child=child.name, code=code, ran_s=round(ran_s, 1), restart_in_s=wait,
                        log=str(child.log_path))
            await asyncio.sleep(wait)
            if self._stopping or child.stopping:  # stopped while we waited to restart it
                return
            await self._spawn(child)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """Stop in reverse order of start: agents first, so they can hand back their leases and
        deregister while the API is still there, then the services."""
        self._stopping = True
        for child in reversed(list(self.children.values())):
            await self._stop_child(child, timeout_s)
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        for child in self.children.values():
            await self._drain(child)
            if child.pump is not None:
                child.pump.cancel()  # a grandchild that outlived it: its output is not ours to keep
            if child.log is not None:
                child.log.close()

    @staticmethod
    async def _drain(child: Child, timeout_s: float = 5.0) -> None:
        """Let the log take the last lines of a child that ended (its crash, most often). A
        grandchild still holding the pipe open is not waited for longer than `timeout_s`."""
        if child.pump is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(child.pump), timeout_s)

    async def stop_children(self, names: list[str], timeout_s: float = 10.0) -> None:
        await asyncio.gather(*(self._stop_child(self.children[n], timeout_s) for n in names))

    @staticmethod
    async def _stop_child(child: Child, timeout_s: float) -> None:
        child.stopping = True
        if child.process is None or child.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(child.process.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)
            await child.process.wait()
