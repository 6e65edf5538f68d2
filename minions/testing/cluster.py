"""What every drill stands on: the three services as real processes, a fleet of real agent
processes (`python -m minions.agents.macos --kind sleep`), an admin client, and a direct database
connection for the audit and for picking victims.

`MINIONS_CHAOS=long` (`make chaos`) scales the drills up; `pick(short, long)` is how each drill
says by how much. The short form is what `make test` runs: small tasks, ms-scale sleeps,
heartbeat 0.5 s, lease timeout 2 s.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import asyncpg

from minions import jsoncodec
from minions.db.connect import connect
from minions.db.migrate import migrate
from minions.embedded_pg import EmbeddedPostgres
from minions.sdk import MinionsClient, MinionsError
from minions.testing import waiting
from minions.testing.agents import AgentFleet, AgentProcess
from minions.testing.factories import make_tokens
from minions.testing.processes import Services

LONG = os.environ.get("MINIONS_CHAOS", "").lower() == "long"
TEAM, PROJECT = "chaos", "drill"
HEARTBEAT_S = 0.5
LEASE_TIMEOUT_S = 2.0
T = TypeVar("T")
# `await make_cluster(database_url, **Services settings)` (the fixture in tests/chaos/conftest.py).
ClusterFactory = Callable[..., Awaitable["Cluster"]]


def pick(short: T, long: T) -> T:
    """The short form's value, or the long form's under MINIONS_CHAOS=long."""
    return long if LONG else short


def sleep_records(n: int, ms: int, prefix: str = "r") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i:05d}", "ms": ms} for i in range(n)]


def log_events(log: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of a process (services and agents log one JSON object a line) whose
    event is `event`."""
    found = []
    for line in log.splitlines():
        if f'"{event}"' not in line:
            continue
        try:
            entry = jsoncodec.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event:
            found.append(entry)
    return found


async def eventually(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float,
                     interval: float = 0.1) -> T:
    """minions/testing/waiting.py's `eventually`, riding out probes that fail while a drill has a
    service or the database down."""
    async def tolerant() -> T | None:
        try:
            return await probe()
        except (aiohttp.ClientError, MinionsError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return None

    return await waiting.eventually(tolerant, what, timeout, interval)


@dataclass
class Cluster:
    services: Services
    fleet: AgentFleet
    admin_token: str
    executor_token: str
    client: MinionsClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = MinionsClient(self.services.api_url, self.admin_token, timeout_s=30)

    @property
    def database_url(self) -> str:
        return self.services.database_url

    @classmethod
    async def create(cls, database_url: str, workdir: Path, **settings: Any) -> Cluster:
        admin, executor = await make_tokens(database_url)
        options = {"heartbeat_interval_s": HEARTBEAT_S, "lease_timeout_s": LEASE_TIMEOUT_S, "long_poll_s": 2.0,
                   **settings}
        services = Services(database_url, workdir, **options)
        return cls(services, AgentFleet(services, executor), admin, executor)

    async def close(self) -> None:
        await self.client.close()
        self.fleet.stop_all()
        self.services.stop_all()

    def logs(self) -> str:
        return f"{self.services.logs()}\n{self.fleet.logs()}"

    # Agents ------------------------------------------------------------------------------------
    async def start_agents(self, n: int, prefix: str = "agent") -> list[AgentProcess]:
        """n agent processes, returned once every one of them has registered."""
        first = len(self.fleet.agents)
        agents = [self.fleet.start(f"{prefix}-{first + i:02d}") for i in range(n)]
        names = {a.name for a in agents}

        async def registered() -> bool:
            known = {e["name"] for e in await self.client.executors() if e["status"] != "offline"}
            return names <= known

        await eventually(registered, f"{n} agents to register", timeout=30 + 2 * n)
        return agents

    def agent(self, name: str) -> AgentProcess:
        return next(a for a in self.fleet.agents if a.name == name)

    def alive_agents(self) -> list[AgentProcess]:
        return [a for a in self.fleet.agents if a.process.poll() is None]

    # Tasks -------------------------------------------------------------------------------------
    async def submit(self, name: str, records: list[dict[str, Any]], subtask_size: int,
                     **extra: Any) -> dict[str, Any]:
        return await self.client.submit({"team": TEAM, "project": PROJECT, "name": name, "kind": "sleep",
                                         "input": {"records": records}, "subtask_size": subtask_size,
                                         **extra})

    async def task(self, name: str) -> dict[str, Any]:
        return await self.client.task(TEAM, PROJECT, name)

    async def wait_finished(self, name: str, timeout: float) -> dict[str, Any]:
        async def finished() -> dict[str, Any] | None:
            task = await self.task(name)
            return task if task["finished_at"] else None

        try:
            return await eventually(finished, f"task {name} to finish", timeout, interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    async def wait_progress(self, name: str, fraction: float, timeout: float) -> dict[str, Any]:
        """Returns once at least `fraction` of the task's records are done."""
        async def progressed() -> dict[str, Any] | None:
            task = await self.task(name)
            total = task["records"]["total"]
            return task if total and task["records"]["done"] >= fraction * total else None

        return await eventually(progressed, f"{fraction:.0%} of {name}", timeout, interval=0.05)

    async def results(self, name: str) -> list[dict[str, Any]]:
        body = b"".join([chunk async for chunk in self.client.results(TEAM, PROJECT, name)])
        return [jsoncodec.loads(line) for line in body.splitlines() if line.strip()]

    # The database, for picking victims -----------------------------------------------------------
    async def db(self) -> asyncpg.Connection:
        return await connect(self.database_url)

    async def holders(self, name: str | None) -> dict[str, list[tuple[int, str]]]:
        """Executor name -> the (subtask_id, lease token) it currently holds in task `name` (in any
        task when `name` is None)."""
        conn = await self.db()
        try:
            rows = await conn.fetch(
                """SELECT e.name, s.subtask_id, s.lease_token::text AS token
                     FROM subtasks s JOIN tasks t ON t.id = s.task_id
                     JOIN executors e ON e.id = s.lease_executor
                    WHERE t.team = $1 AND t.project = $2 AND ($3::text IS NULL OR t.name = $3)
                      AND s.state = 'leased'
                    ORDER BY s.leased_at""", TEAM, PROJECT, name)
        finally:
            await conn.close()
        held: dict[str, list[tuple[int, str]]] = {}
        for r in rows:
            held.setdefault(r["name"], []).append((r["subtask_id"], r["token"]))
        return held

    async def kill_holders(self, n: int, task: str | None = None) -> dict[str, list[tuple[int, str]]]:
        """kill -9 `n` agents that hold a lease (of `task`, or of any task) and return what each held
        at its death. That is read after the kill, once requests already in flight have landed: an
        agent can finish a subtask between a look and the kill. One that died holding nothing
        (between two subtasks) does not count, and another is killed in its place. Near a task's end
        fewer than `n` may hold anything: once one holder is dead and no other is left, those do; a
        task that ended (or has nothing left to hold) before any could be killed kills nobody."""
        dead: dict[str, list[tuple[int, str]]] = {}
        while len(dead) < n:
            async def candidates() -> list[str]:
                holders = await self.holders(task)
                return [a.name for a in self.alive_agents() if a.name in holders]

            if not await candidates() and (dead or (task and await self._nothing_left(task))):
                break
            victims = (await eventually(candidates, f"agents holding a lease of {task or 'any task'}", timeout=20,
                                        interval=0.02))[: n - len(dead)]
            for name in victims:
                self.agent(name).kill()
            await asyncio.sleep(0.3)
            held = await self.holders(task)
            dead |= {name: held[name] for name in victims if name in held}
        return dead

    async def _nothing_left(self, name: str) -> bool:
        """The task has ended, or has no subtask pending or in flight: nobody can hold one of it again."""
        task = await self.task(name)
        left = task["subtasks"]
        return bool(task["finished_at"]) or left["pending"] + left["leased"] + left["checking"] == 0

    async def attempt_outcome(self, token: str) -> list[str]:
        conn = await self.db()
        try:
            rows = await conn.fetch("SELECT outcome FROM subtask_attempts WHERE lease_token = $1::uuid", token)
        finally:
            await conn.close()
        return [r["outcome"] for r in rows]


class DedicatedPostgres:
    """A PostgreSQL server of the drill's own (never the shared session one): drills stop it."""

    def __init__(self) -> None:
        # Not under pytest's tmp_path: PostgreSQL runs as its own system user when we are root, and
        # pytest's base temp folder is private to us.
        self.root = Path(tempfile.mkdtemp(prefix="minions-chaos-pg-"))
        self.server = EmbeddedPostgres(self.root / "pgdata", fast=True)

    async def start(self) -> str:
        """Starts the server and returns the URL of a migrated database on it."""
        self.server.start()
        conn = await asyncpg.connect(self.server.url)
        try:
            await conn.execute("CREATE DATABASE chaos")
        finally:
            await conn.close()
        url = self.server.url_for("chaos")
        await migrate(url)
        return url

    def stop(self, mode: str = "immediate") -> None:
        self.server.stop(mode)

    def restart(self) -> None:
        self.server.start()

    def close(self) -> None:
        try:
            self.server.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
