"""The services as real processes (`python -m minions.services.api` ...), as production runs them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import minions
from minions import cluster_settings, config
from minions.db.migrate import migrate
from minions.embedded_pg import free_port
from minions.sdk.health import wait_until_healthy

# Children run `python -m minions…` from the folder that holds the `minions` package in use, so they
# import this same code whether it is installed or checked out.
IMPORT_ROOT = Path(minions.__file__).resolve().parent.parent


class ManagedProcess:
    """A child process of a test: kill -9 it, SIGTERM it, read its log."""

    process: subprocess.Popen[bytes] | None
    log_path: Path

    def kill(self) -> None:
        """kill -9: no goodbye, no cleanup."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 15) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


async def _migrate_and_apply(database_url: str, settings: config.Settings) -> None:
    await migrate(database_url)
    await cluster_settings.apply_given_at(database_url, settings)


def _run_to_end(work: Coroutine[Any, Any, None]) -> None:
    """Runs `work` on an event loop of its own, in a thread, and waits: callable from synchronous
    code, whether or not an event loop is running in this thread."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, work).result(timeout=60)


def stop_together(processes: Iterable[ManagedProcess], timeout: float = 10) -> None:
    """SIGTERM every process first, then wait for them all within one `timeout`; kill -9 those still
    running by then. Each shuts down in parallel with the others: stopping N services costs the
    slowest one's shutdown, not the sum of all."""
    signalled = []
    for each in processes:
        if each.process is not None and each.process.poll() is None:
            each.process.send_signal(signal.SIGTERM)
            signalled.append(each)
    deadline = time.monotonic() + timeout
    for each in signalled:
        assert each.process is not None
        try:
            each.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            each.kill()


@dataclass
class Service(ManagedProcess):
    name: str
    module: str
    env: dict[str, str]
    log_path: Path
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Service:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args], env=self.env, cwd=IMPORT_ROOT,
            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
        )
        log.close()
        return self


@dataclass
class Services:
    """API, splitter and watchdog against one database and one local store."""

    database_url: str
    workdir: Path
    heartbeat_interval_s: float = 1.0
    lease_timeout_s: float = 3.0
    max_attempts: int = 3
    long_poll_s: float = 5.0
    straggler_factor: float = 0.0
    store: str = ""  # default: a folder under workdir
    # False: every task goes through the splitter (MINIONS_INLINE_SPLIT_MAX_BYTES=0), for drills of it.
    split_at_submit: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    running: dict[str, Service] = field(default_factory=dict)
    _cluster_applied: tuple[float, int] | None = field(default=None, repr=False)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store_root(self) -> Path:
        return self.workdir / "store"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "MINIONS_DATABASE_URL": self.database_url,
            "MINIONS_STORE": self.store or self.store_root.as_uri(),
            "MINIONS_PORT": str(self.port),
            "MINIONS_HOST": "127.0.0.1",
            "MINIONS_API_URL": self.api_url,
            "MINIONS_HEARTBEAT_INTERVAL_S": str(self.heartbeat_interval_s),
            # Cluster-wide: the services read these from the database; `start` writes them there
            # (through `minions db migrate`, which applies them).
            "MINIONS_LEASE_TIMEOUT_S": str(self.lease_timeout_s),
            "MINIONS_MAX_ATTEMPTS": str(self.max_attempts),
            "MINIONS_LONG_POLL_S": str(self.long_poll_s),
            "MINIONS_SWEEP_INTERVAL_S": "1",
            "MINIONS_STRAGGLER_FACTOR": str(self.straggler_factor),
            # Off unless a test asks (tests/security/test_spot_checks.py): a random share of held results
            # would make other tests' counts depend on chance.
            "MINIONS_SPOT_CHECK_SHARE": "0",
            "MINIONS_TRUST_AGREEMENTS": "0",
            # Off unless a test asks (tests/core/test_result_parts.py): tests that tamper with or count per-subtask
            # objects must not race the watchdog compacting them into parts.
            "MINIONS_COMPACT_INTERVAL_S": "0",
            "MINIONS_LOG_LEVEL": "info",
            "PYTHONUNBUFFERED": "1",
            **({} if self.split_at_submit else {"MINIONS_INLINE_SPLIT_MAX_BYTES": "0"}),
            **self.extra_env,
        }

    def start(self, name: str) -> Service:
        self.apply_cluster_settings()
        module = f"minions.services.{name}"
        service = Service(name, module, self.env(), self.workdir / f"{name}.log").start()
        self.running[name] = service
        return service

    def apply_cluster_settings(self) -> None:
        """The lease timeout and max attempts, as set here, become the database's: what every
        service reads (once per change of either). What `minions db migrate` does with this
        environment (migrate, then apply the cluster settings it names), done in this process: a
        `minions` process per cluster start cost a second of the test's time for its imports."""
        wanted = (self.lease_timeout_s, self.max_attempts)
        if self._cluster_applied == wanted:
            return
        try:
            settings = config.from_env(self.env()).validate()
        except config.ConfigError as exc:
            raise AssertionError(f"minions db migrate would refuse these settings: {exc}") from None
        _run_to_end(_migrate_and_apply(self.database_url, settings))
        self._cluster_applied = wanted

    async def start_all(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name in ("api", "splitter", "watchdog"):
            self.start(name)
        await self.wait_healthy()

    async def wait_healthy(self, timeout: float = 30) -> None:
        if not await wait_until_healthy(self.api_url, timeout):
            raise AssertionError(f"API never became healthy:\n{self.running['api'].log()[-3000:]}")

    def stop_all(self) -> None:
        stop_together(self.running.values())

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{s.log()[-4000:]}" for n, s in self.running.items())
