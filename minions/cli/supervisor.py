"""Runs the services and local agents of `minions up` as child processes: each logs to its own file,
a child that dies is restarted with backoff, and stop() ends them all (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from minions.logging import get_logger

log = get_logger(__name__)


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    stopping: bool = False
    log_file: IO[bytes] | None = field(default=None, repr=False)
    pass_fds: tuple[int, ...] = ()  # descriptors the child inherits (the API's listening socket)


class Supervisor:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: dict[str, Child] = {}
        self._stopping = False
        self._watchers: list[asyncio.Task[None]] = []

    async def start(self, name: str, module: str, args: list[str], env: dict[str, str],
                    pass_fds: tuple[int, ...] = ()) -> Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        child = Child(name, [sys.executable, "-m", module, *args], {**os.environ, **env},
                      self.log_dir / f"{name}.log", pass_fds=pass_fds)
        self.children[name] = child
        await self._spawn(child)
        self._watchers.append(asyncio.create_task(self._watch(child), name=f"watch-{name}"))
        return child

    async def _spawn(self, child: Child) -> None:
        child.log_file = child.log_path.open("ab")
        child.process = await asyncio.create_subprocess_exec(
            *child.argv, env=child.env, stdout=child.log_file, stderr=child.log_file,
            stdin=asyncio.subprocess.DEVNULL, start_new_session=True, pass_fds=child.pass_fds,
        )

    async def _watch(self, child: Child) -> None:
        delay = 1.0
        while True:
            assert child.process is not None
            code = await child.process.wait()
            if child.log_file:
                child.log_file.close()
            if self._stopping or child.stopping:
                return
            child.restarts += 1
            log.warning("child_exited", child=child.name, code=code, restart_in_s=delay, log=str(child.log_path))
            print(f"minions up: {child.name} exited with {code}; restarting in {delay:.0f}s "
                  f"(log: {child.log_path})", file=sys.stderr)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
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
