"""The agent's loop against the real API (in this process, on a real port, over a real database):
complete, fail (retryable and permanent), release when the owner returns, drop a lost or cancelled
lease, survive a refused late complete, stop cleanly on SIGTERM and exit 78 on a bad token.

What the agent did is read where it really shows: the database (subtask_attempts, subtasks,
executors), the API's answers, and the API's access log (every request the agent made, with the
status it got). Tasks are submitted through the API and split by the real splitter code, or, for
inputs the API would refuse, made with the same SQL functions the splitter calls.

The only stand-ins are for what this machine cannot do: the owner's load average (the owner
"comes back" when it goes over the limit) and the OS's keep-awake call (recorded instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import random
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from minions import jsoncodec
from minions.agents.macos import agent as agent_module
from minions.agents.macos import serve as serve_module
from minions.agents.macos.agent import Agent
from minions.agents.macos.client import ExecutorClient, Rejected
from minions.agents.macos.config import PolicyConfig, build
from minions.agents.macos.hardware import Hardware
from minions.agents.macos.jobs import JobState
from minions.agents.macos.policy import OwnerPolicy
from minions.agents.macos.runners.base import Runner
from minions.agents.macos.runners.embedding import EmbeddingRunner
from minions.agents.macos.runners.model_paths import MINILM
from minions.agents.macos.runners.sleep import SleepRunner
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.backoff import Backoff
from minions.db.connect import connect
from minions.protocol import LeaseCompletion
from minions.services.splitter.split import split_task
from minions.store.base import ObjectStore
from minions.store.factory import open_store
from minions.testing.factories import make_token
from minions.testing.waiting import T, eventually
from tests.support.api import ApiHarness, running_api

ROOT = Path(__file__).resolve().parents[2]
MACHINE = Hardware(os="Linux test", chip="test", memory_gb=1, device="cpu", cpu_count=2)
# A torch device this machine does not have: the real embedding runner then crashes with torch's
# own RuntimeError, the stand-in for an accelerator running out of memory mid-subtask.
MISSING_DEVICE = "cuda" if platform.system() == "Darwin" else "mps"
ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


@dataclass
class World:
    """The real API, a connection to its database, the object store, and its access log."""

    api: ApiHarness
    conn: asyncpg.Connection
    store: ObjectStore
    caplog: pytest.LogCaptureFixture

    async def submit(self, name: str, kind: str, records: list[dict[str, Any]], *, model: str | None = None,
                     subtask_size: int | None = None, priority: int = 0) -> int:
        """Submit through the API; a task the API did not split at submission (over
        MINIONS_INLINE_SPLIT_MAX_BYTES) is split with the splitter's own code."""
        body: dict[str, Any] = {"team": "search", "project": "ranker", "name": name, "kind": kind,
                                "input": {"records": records}, "priority": priority}
        if model is not None:
            body["model"] = model
        if subtask_size is not None:
            body["subtask_size"] = subtask_size
        reply = await self.api.call("POST", "/api/v1/tasks", json=body)
        assert reply.status == 201, reply.body
        task_id: int = await self.conn.fetchval(
            "SELECT id FROM tasks WHERE team = 'search' AND project = 'ranker' AND name = $1", name)
        if reply.body["status"] == "submitted":
            result = await split_task(self.conn, self.store, task_id)
            assert result.outcome == "done", result
        else:
            assert reply.body["status"] == "queued", reply.body
        return task_id

    async def submit_raw(self, name: str, body: bytes, records: int, *, kind: str = "sleep",
                         model: str = "sleep", delete_input: bool = False) -> int:
        """A one-subtask task over `body` (uploaded through the API) that claims `records` records,
        made with the SQL functions the splitter calls: for inputs the API itself would refuse."""
        reply = await self.api.call("POST", "/api/v1/inputs", data=body,
                                    headers={"Content-Type": "application/x-ndjson"})
        assert reply.status == 201, reply.body
        uri: str = reply.body["uri"]
        if delete_input:
            await self.store.delete(uri)
        task_id: int = await self.conn.fetchval(
            """INSERT INTO tasks (team, project, name, kind, model, subtask_size, max_attempts, input_uri,
                                  request_hash)
               VALUES ('search', 'ranker', $1, $2, $3, $4, 3, $5, 'h') RETURNING id""",
            name, kind, model, records, uri)
        await self.conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
        assert await self.conn.fetchval("SELECT minion_add_subtasks($1, $2, $3, '{0}', $4, 0, $5, $6)",
                                        task_id, [0], [len(body)], [records], len(body), records)
        await self.conn.execute("SELECT minion_finish_split($1)", task_id)
        return task_id

    async def task(self, name: str) -> dict[str, Any]:
        reply = await self.api.call("GET", f"/api/v1/tasks/search/ranker/{name}")
        assert reply.status == 200, reply.body
        task: dict[str, Any] = reply.body
        return task

    async def status_is(self, name: str, *statuses: str) -> bool:
        return (await self.task(name))["status"] in statuses

    async def results(self, name: str) -> list[dict[str, Any]]:
        reply = await self.api.call("GET", f"/api/v1/tasks/search/ranker/{name}/results")
        assert reply.status == 200, reply.body
        return [jsoncodec.loads(line) for line in reply.body.splitlines()]

    async def attempts(self, task_id: int) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await self.conn.fetch(
            """SELECT subtask_id, attempt, outcome, error, records, seconds, executor_id,
                      lease_token::text AS token, started_at, ended_at
                 FROM subtask_attempts WHERE task_id = $1 ORDER BY ended_at, attempt""", task_id)
        return rows

    async def leased_token(self, task_id: int) -> str | None:
        token: str | None = await self.conn.fetchval(
            "SELECT lease_token::text FROM subtasks WHERE task_id = $1 AND state = 'leased'", task_id)
        return token

    async def reclaim(self, executor_id: str) -> None:
        """The watchdog's own step, as if this executor had been silent past the lease timeout (a
        heartbeat that lands at that very moment wins the race: then the next try reclaims)."""

        async def reclaimed() -> bool:
            taken: int = await self.conn.fetchval("SELECT minion_reclaim_executor($1, 0)", uuid.UUID(executor_id))
            return taken >= 1

        await eventually(reclaimed, "the reclaim", timeout_s=5)

    def requests(self) -> list[tuple[str, str, int]]:
        """Every request the API served so far, in order: (method, path, status)."""
        out = []
        for record in self.caplog.records:
            if record.name == "aiohttp.access" and (m := ACCESS.search(record.getMessage())):
                out.append((m["method"], m["path"], int(m["status"])))
        return out

    def lease_calls(self, token: str | None = None) -> list[tuple[str, int]]:
        """(action, status) of every complete/fail/release, of one lease or of all."""
        calls = []
        for _, path, status in self.requests():
            if m := re.fullmatch(r"/api/v1/leases/([^/]+)/(complete|fail|release)", path):
                if token is None or m[1] == token:
                    calls.append((m[2], status))
        return calls


@contextlib.asynccontextmanager
async def world(database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                **settings: Any) -> AsyncIterator[World]:
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    overrides = {"heartbeat_interval_s": 0.2, "long_poll_s": 1.0, "lease_timeout_s": 60.0, **settings}
    async with running_api(database_url, tmp_path / "store", **overrides) as api:
        conn = await connect(database_url)
        store = open_store(api.settings.store)
        try:
            yield World(api, conn, store, caplog)
        finally:
            await store.close()
            await conn.close()


@pytest.fixture
async def w(database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> AsyncIterator[World]:
    async with world(database_url, tmp_path, caplog) as harness:
        yield harness


@dataclass
class Harness:
    agent: Agent
    owner: dict[str, float]
    awake: list[str]
    runners: dict[str, Runner] = field(default_factory=dict)

    @property
    def executor_id(self) -> str:
        return self.agent.registration.executor_id


@contextlib.asynccontextmanager
async def running_agent(w: World, models: tuple[str, ...] = ("m1",),
                        client_type: type[ExecutorClient] = ExecutorClient) -> AsyncIterator[Harness]:
    """The agent's Agent class, in this process, against the real API; yields once registered and
    stops (hands back, deregisters) on the way out."""
    owner = {"load": 0.0}  # the owner "comes back" when the load goes over max_load
    awake: list[str] = []

    @contextlib.asynccontextmanager
    async def keep_awake() -> AsyncIterator[None]:
        awake.append("on")
        try:
            yield
        finally:
            awake.append("off")

    config = build({"token": w.api.executor, "name": "test-box", "prefer": ["search/ranker"]})
    runners: dict[str, Runner] = {"sleep": SleepRunner(),
                                  "embedding": EmbeddingRunner(TorchSettings(device=MISSING_DEVICE))}
    policy = OwnerPolicy(PolicyConfig(max_load=1.0), "Linux", load_average=lambda: owner["load"])
    async with client_type(w.api.url, w.api.executor,
                           backoff=Backoff(0.01, 0.05, rng=random.Random(0))) as client:
        agent = Agent(config, client, runners, policy, MACHINE, list(models), keep_awake=keep_awake,
                      policy_poll_s=0.05, idle_poll_s=0.05)
        task = asyncio.create_task(agent.run())
        harness = Harness(agent, owner, awake, runners)
        try:
            await eventually(lambda: _registered(agent, task), "the agent to register")
            yield harness
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for runner in runners.values():
                await runner.aclose()


async def _registered(agent: Agent, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()  # surfaces why the agent stopped
    try:
        return bool(agent.registration.executor_id)
    except RuntimeError:  # not registered yet
        return False


async def test_registers_then_completes_a_subtask_in_order(w: World) -> None:
    async with running_agent(w) as h:
        records = [{"id": f"r{i}", "ms": i} for i in range(5)]
        task_id = await w.submit("t", "sleep", records, subtask_size=5)
        await eventually(lambda: w.status_is("t", "completed"), "the task to complete")
        beat = f"/api/v1/executors/{h.executor_id}/heartbeat"

        async def heartbeat_answered() -> bool:
            return ("POST", beat, 200) in w.requests()

        await eventually(heartbeat_answered, "a heartbeat")
    executors = (await w.api.call("GET", "/api/v1/executors")).body["executors"]
    assert len(executors) == 1
    registered = executors[0]
    assert registered["id"] == h.executor_id and registered["name"] == "test-box"
    assert registered["kinds"] == ["sleep", "embedding"] and registered["models"] == ["m1"]
    assert registered["preferences"] == [{"team": "search", "project": "ranker", "task_name": None}]
    assert registered["hardware"]["device"] == "cpu"
    assert registered["status"] == "offline"  # deregistered on the way out
    assert await w.results("t") == [{"id": f"r{i}", "slept_ms": i} for i in range(5)]
    [done] = await w.attempts(task_id)
    assert done["outcome"] == "done" and done["records"] == 5 and done["seconds"] >= 0
    assert str(done["executor_id"]) == h.executor_id
    assert h.awake == ["on", "off"]

    def ours() -> list[str]:
        return [path for _, path, _ in w.requests() if h.executor_id in path or "/leases/" in path]

    # Its last word (the access log line is written just after the answer, hence the wait).
    await until(lambda: ours()[-1] == f"/api/v1/executors/{h.executor_id}/deregister", "the deregistration")
    assert h.agent.completed == 1


async def test_runner_errors_fail_the_lease(w: World) -> None:
    async with running_agent(w, models=(MINILM,)) as h:
        # Another process of this machine registers the same name and token with one more kind:
        # the server now hands this agent completion work it has no runner for.
        again = await w.api.register("test-box", kinds=["sleep", "embedding", "completion"], models=[MINILM, "m1"])
        assert again == h.executor_id
        crash = await w.submit("crash", "embedding", [{"id": 1, "text": "x"}], model=MINILM)
        unknown_kind = await w.submit("unknown-kind", "completion", [{"id": 1, "prompt": "x"}], model="m1")
        bad_count = await w.submit_raw("bad-count", b'{"id": 1, "ms": 1}\n', records=2)
        bad_record = await w.submit_raw("bad-record", b'{"id": 1, "ms": "soon"}\n', records=1)
        gone_input = await w.submit_raw("gone-input", b'{"id": 1, "ms": 1}\n', records=1, delete_input=True)
        for name in ("crash", "unknown-kind", "bad-count", "bad-record", "gone-input"):
            await eventually(lambda name=name: w.status_is(name, "failed"), f"task {name} to fail")  # type: ignore[misc]

    async def outcomes(task_id: int) -> tuple[list[str], str]:
        attempts = await w.attempts(task_id)
        assert all(str(a["executor_id"]) == h.executor_id for a in attempts)
        return [a["outcome"] for a in attempts], attempts[-1]["error"]

    # Retryable: requeued until max_attempts (3), then failed for good with the last error.
    kinds, error = await outcomes(crash)
    assert kinds == ["failed"] * 3 and "RuntimeError" in error and MISSING_DEVICE in error.lower()
    kinds, error = await outcomes(gone_input)
    assert kinds == ["failed"] * 3 and "object store answered HTTP 404" in error
    # Permanent: failed for good at the first attempt.
    kinds, error = await outcomes(unknown_kind)
    assert kinds == ["failed"] and "does not serve kind" in error
    kinds, error = await outcomes(bad_count)
    assert kinds == ["failed"] and "holds 1 records" in error
    kinds, error = await outcomes(bad_record)
    assert kinds == ["failed"] and "ms must be a number" in error
    assert (await w.task("bad-record"))["error"]
    await until(lambda: w.lease_calls() == [("fail", 200)] * (3 + 3 + 1 + 1 + 1), "the fail calls in the access log")
    assert h.agent.completed == 0


async def test_owner_back_releases_at_once(w: World) -> None:
    async with running_agent(w) as h:
        busy = await w.submit("busy", "sleep", [{"id": 1, "ms": 30_000}])
        token = await eventually(lambda: w.leased_token(busy), "the agent to claim")
        await eventually(lambda: _now(h.agent.held_leases() == [token]), "the agent to hold the lease")
        h.owner["load"] = 5.0
        started = time.monotonic()
        [released] = await eventually(lambda: w.attempts(busy), "the release")
        # The watchdog is not even running, and the lease timeout is 60 s: this is the agent's own
        # hand-back (the bound only guards against waiting for a timeout).
        assert time.monotonic() - started < 10
        assert released["outcome"] == "released" and released["token"] == token
        assert await w.conn.fetchval("SELECT attempts FROM subtasks WHERE task_id = $1", busy) == 0
        await until(lambda: w.lease_calls(token) == [("release", 200)], "the release in the access log")
        # While the owner is busy, nothing more is claimed; afterwards work resumes.
        await w.submit("later", "sleep", [{"id": 2, "ms": 1}], priority=1)
        await asyncio.sleep(0.5)
        assert await w.conn.fetchval("SELECT count(*) FROM subtasks WHERE state <> 'pending'") == 0
        assert h.agent.held_leases() == []
        h.owner["load"] = 0.0
        await eventually(lambda: w.status_is("later", "completed"), "work to resume")
    assert h.awake[:2] == ["on", "off"]
    assert await w.results("later") == [{"id": 2, "slept_ms": 1}]


async def test_pipelined_agent_holds_a_bounded_few_and_gives_all_back_at_once(w: World) -> None:
    """The next subtask is claimed (its input fetched) while one computes, never more than
    the bound held (2 before the agent has timed a subtask), and the owner's return hands back every
    one of them, the running and the waiting, within a second or so."""
    async with running_agent(w) as h:
        task_id = await w.submit("pipe", "sleep", [{"id": i, "ms": 30_000} for i in range(6)], subtask_size=1)

        async def held_in_db() -> list[str]:
            return [r["token"] for r in await w.conn.fetch(
                "SELECT lease_token::text AS token FROM subtasks WHERE task_id = $1 AND state = 'leased'", task_id)]

        await eventually(lambda: _now(len(h.agent.held_leases()) == 2), "the agent to hold two leases")
        await asyncio.sleep(0.5)  # and no more, however long it waits
        assert h.agent.lease_bound() == 2
        assert sorted(await held_in_db()) == sorted(h.agent.held_leases())
        # One has the device, the other waits for it with its input fetched.
        assert sorted(h.agent.job_states().values()) == [JobState.CLAIMED, JobState.RUNNING]
        h.owner["load"] = 5.0
        started = time.monotonic()
        await eventually(lambda: _now(h.agent.held_leases() == []), "the agent to hand everything back")
        async def none_held() -> bool:
            return await held_in_db() == []

        await eventually(none_held, "the releases")
        # The agent's own hand-back, not a lease timeout (60 s here): the bound only guards that.
        assert time.monotonic() - started < 10
        outcomes = [a["outcome"] for a in await w.attempts(task_id)]
        assert outcomes == ["released", "released"]
        assert await w.conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND state = 'pending'",
                                     task_id) == 6


async def test_completes_that_come_together_go_in_one_batched_request(w: World) -> None:
    """While one complete is in flight, those that come meanwhile wait and go together in
    one POST /api/v1/leases/complete; every subtask is done once, its output in order."""
    async with running_agent(w) as h:
        records = [{"id": i, "ms": 0} for i in range(60)]
        task_id = await w.submit("many", "sleep", records, subtask_size=1)
        await eventually(lambda: w.status_is("many", "completed"), "the task to complete")
        calls = [(path, status) for method, path, status in w.requests() if method == "POST"]
        batched = [status for path, status in calls if path == "/api/v1/leases/complete"]
        single = [status for path, status in calls if re.fullmatch(r"/api/v1/leases/[^/]+/complete", path)]
        assert batched and set(batched) == {200}, calls
        assert len(batched) + len(single) < len(records)
        assert [a["outcome"] for a in await w.attempts(task_id)] == ["done"] * len(records)
        assert await w.results("many") == [{"id": i, "slept_ms": 0} for i in range(60)]
        await until(lambda: h.agent.completed == len(records), "the agent to count every commit")


class _SlowAnswers(ExecutorClient):
    """The real client, but each complete's answer reaches the agent only after several heartbeats
    have gone out (a slow network back from the API)."""

    delay_s = 1.0

    async def complete(self, token: str, records: int, seconds: float, output: bytes | None = None) -> None:
        await super().complete(token, records, seconds, output)
        await asyncio.sleep(self.delay_s)

    async def complete_batch(self, completions: list[LeaseCompletion]) -> dict[str, Rejected | None]:
        outcomes = await super().complete_batch(completions)
        await asyncio.sleep(self.delay_s)
        return outcomes


@pytest.mark.parametrize("max_claim", [1, 32])
async def test_a_heartbeat_while_the_complete_is_answered_keeps_the_subtask_done(
        database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, max_claim: int) -> None:
    """The server commits a complete, then a heartbeat names its lease before the answer is back:
    the heartbeat answers "lost" (the lease is no longer leased), and the agent waits for the
    complete's own answer rather than drop a subtask that is done: a job committing is not one a
    heartbeat aborts. A server whose claims take one lease at a time (max_claim 1) and one that
    takes many: the completes go through the same buffer either way."""
    async with world(database_url, tmp_path, caplog, max_claim=max_claim) as w, \
            running_agent(w, client_type=_SlowAnswers) as h:
        assert h.agent.registration.max_claim == max_claim
        assert h.agent.registration.heartbeat_interval_s * 3 < _SlowAnswers.delay_s
        task_id = await w.submit("slow-answer", "sleep", [{"id": 1, "ms": 0}])
        await eventually(lambda: w.status_is("slow-answer", "completed"), "the task to complete")
        token = (await w.attempts(task_id))[0]["token"]
        beat = f"/api/v1/executors/{h.executor_id}/heartbeat"

        async def beats() -> int:
            return sum(1 for _, path, _ in w.requests() if path == beat)

        after = await beats()
        await eventually(lambda: _now(h.agent.completed == 1 or None), "the agent to count the commit")
        assert await beats() > after  # heartbeats went out while the answer was on its way
        await eventually(lambda: _now(token not in h.agent.held_leases() or None), "the job to leave")
        assert "lease_gone" not in w.caplog.text
        assert [a["outcome"] for a in await w.attempts(task_id)] == ["done"]


@pytest.mark.parametrize("state", ["cancelled", "lost"])
async def test_heartbeat_answer_drops_the_work(w: World, state: str) -> None:
    async with running_agent(w) as h:
        task_id = await w.submit("long", "sleep", [{"id": 1, "ms": 30_000}])
        token = await eventually(lambda: w.leased_token(task_id), "the agent to claim")
        await eventually(lambda: _now(h.agent.held_leases() == [token]), "the agent to hold the lease")
        if state == "cancelled":
            reply = await w.api.call("POST", "/api/v1/tasks/search/ranker/long/cancel")
            assert reply.status == 200 and reply.body["status"] == "cancelled"
        else:
            await w.reclaim(h.executor_id)
        await eventually(lambda: _now(token not in h.agent.held_leases()), "the agent to drop the lease")
        await asyncio.sleep(0.3)
        # Heard at a heartbeat: the agent says nothing more about that lease.
        assert w.lease_calls(token) == []
        attempts = await w.attempts(task_id)
        assert [(a["token"], a["outcome"]) for a in attempts] == [(token, state)]
        if state == "lost":
            # Requeued by the reclaim: the agent (the only one) takes it again, under a new lease.
            again = await eventually(lambda: w.leased_token(task_id), "the subtask to be claimed again")
            assert again != token
            assert await eventually(lambda: _now(h.agent.held_leases() == [again]), "the new lease")
    assert w.lease_calls(token) == []


async def _now(value: T) -> T:
    return value


async def until(condition: Callable[[], bool], what: str) -> None:
    await eventually(lambda: _now(condition()), what)


async def test_late_complete_is_refused_and_the_agent_goes_on(
        database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Heartbeats 30 s apart: no heartbeat tells the agent its lease is gone; its late output is refused.
    async with world(database_url, tmp_path, caplog, heartbeat_interval_s=30.0) as w, running_agent(w) as h:
        first = await w.submit("first", "sleep", [{"id": 1, "ms": 2000}])
        token = await eventually(lambda: w.leased_token(first), "the agent to claim")
        await w.reclaim(h.executor_id)  # reclaimed meanwhile, as by the watchdog
        second = await w.submit("second", "sleep", [{"id": 2, "ms": 1}], priority=1)
        await eventually(lambda: w.status_is("second", "completed"), "the agent to go on")
        # A small output rides inline in the complete, refused as the lease is gone. (A large one is
        # PUT first: its output URL died with the lease, 403 lease_ended,
        # and the agent fails the lease instead, which is refused too.) When the second finishes
        # within the agent's linger of the first, both go in one batched complete, whose answer
        # refuses the late one inside it: the attempts below show it was not committed either way.
        def refused_late() -> bool:
            alone = w.lease_calls(token)
            batched = any(path == "/api/v1/leases/complete" for _, path, _ in w.requests())
            return alone in ([("complete", 409)], [("fail", 409)]) or (not alone and batched)

        await until(refused_late, "the refused late attempt")
        await eventually(lambda: w.status_is("first", "completed"), "the requeued subtask to be redone")
        attempts = await w.attempts(first)
        assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "lost"), (2, "done")]
        assert attempts[0]["token"] == token and attempts[1]["token"] != token
        assert [a["outcome"] for a in await w.attempts(second)] == ["done"]
        assert await w.results("first") == [{"id": 1, "slept_ms": 2000}]
        # The refused attempt does not count (its answer may trail the commit a moment).
        await until(lambda: h.agent.completed == 2, "the agent to hear its second commit answered")


def _spawn_agent(url: str, token: str, *extra: str) -> Awaitable[asyncio.subprocess.Process]:
    env = {**os.environ, "MINIONS_TOKEN": token, "HOME": "/nonexistent-home"}
    argv = [sys.executable, "-m", "minions.agents.macos", "--api-url", url, "--kind", "sleep", "--no-idle-check",
            "--no-ac-check", "--no-thermal-check", "--name", "sub", *extra]
    return asyncio.create_subprocess_exec(*argv, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
                                          stderr=asyncio.subprocess.PIPE)


async def _read_until(stream: asyncio.StreamReader, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        line = await stream.readline()
        if not line:
            raise AssertionError(f"the agent ended before logging {marker!r}:\n{seen.decode()}")
        seen += line
    return seen


async def test_sigterm_releases_deregisters_and_exits_0(w: World) -> None:
    task_id = await w.submit("long", "sleep", [{"id": 1, "ms": 60_000}])
    proc = await _spawn_agent(w.api.url, w.api.executor)
    try:
        # Its log says when it works on the subtask (a SIGTERM before that, while the claim's answer
        # is still on its way, is handed back by the deregistration alone).
        assert proc.stderr is not None
        early = await asyncio.wait_for(_read_until(proc.stderr, b"subtask_started"), 60)
        token = await w.leased_token(task_id)
        assert token is not None
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 30)
        stderr = early + stderr
        # Quick: it hands back at once instead of finishing a 60 s subtask (generous for a busy box).
        assert time.monotonic() - stopped < 10
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()
    executor_id = str(await w.conn.fetchval("SELECT id FROM executors WHERE name = 'sub'"))
    ready = [e for e in map(jsoncodec.loads, stderr.splitlines()) if e["event"] == "agent_ready"]
    assert [(e["executor_id"], e["kinds"]) for e in ready] == [(executor_id, ["sleep"])] and stdout == b""
    [released] = await w.attempts(task_id)
    assert released["outcome"] == "released" and released["token"] == token
    assert await w.conn.fetchval("SELECT state FROM subtasks WHERE task_id = $1", task_id) == "pending"
    assert await w.conn.fetchval("SELECT status FROM executors WHERE id = $1", uuid.UUID(executor_id)) == "offline"

    def ours() -> list[tuple[str, int]]:
        # Not the long-poll claim the SIGTERM cut short: the server logs it when it notices the
        # hang-up, which may come after the deregistration.
        return [(path, status) for _, path, status in w.requests()
                if (executor_id in path or token in path) and "/claim" not in path]

    await until(lambda: ours()[-2:] == [(f"/api/v1/leases/{token}/release", 200),
                                        (f"/api/v1/executors/{executor_id}/deregister", 200)],
                "release, then deregister, in the access log")
    assert w.lease_calls(token) == [("release", 200)]


async def test_refused_token_exits_78_with_a_clear_message(w: World) -> None:
    proc = await _spawn_agent(w.api.url, "wrong")
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == serve_module.EXIT_CONFIG
    assert b"refused this agent's token" in stderr and b"MINIONS_TOKEN" in stderr
    assert ("POST", "/api/v1/executors/register", 401) in w.requests()


async def test_rejected_registration_exits_78(w: World) -> None:
    # A token scoped to team "search" cannot prefer another team's work: 422 at registration.
    scoped, _ = await make_token(w.conn, "executor", team="search")
    proc = await _spawn_agent(w.api.url, scoped, "--prefer", "other")
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == serve_module.EXIT_CONFIG
    assert b"rejected this agent's registration" in stderr and b"422" in stderr
    assert ("POST", "/api/v1/executors/register", 422) in w.requests()
    assert await w.conn.fetchval("SELECT count(*) FROM executors") == 0


async def test_registration_reports_the_precision_chosen_at_load(w: World) -> None:
    embedding = EmbeddingRunner(TorchSettings(device="cpu", threads=2))
    runners: dict[str, Runner] = {"embedding": embedding}
    try:
        await serve_module.prepare_models(runners)  # what serve() does before registering
        config = build({"token": w.api.executor, "name": "precise-box"})
        async with ExecutorClient(w.api.url, w.api.executor) as client:
            agent = Agent(config, client, runners, OwnerPolicy(PolicyConfig()), MACHINE, [MINILM])
            await agent.register()
    finally:
        await embedding.aclose()
    [choice] = embedding.precision_choices()
    [executor] = (await w.api.call("GET", "/api/v1/executors")).body["executors"]
    [reported] = executor["hardware"]["precision"]
    assert reported["batch_size"] >= 1  # the size chosen at load, which `minions up` says when ready
    # The batch the precisions were timed at (none where only fp32 was tried).
    assert reported.get("timed_batch", 1) <= reported["batch_size"]
    assert {k: v for k, v in reported.items() if k not in ("batch_size", "timed_batch")} == {
        "model": MINILM, "device": "cpu", "precision": choice.precision, "weights": choice.weights,
        "cosine": round(choice.cosine, 7), "setting": "auto", "backend": "torch"}
    assert reported["cosine"] >= 0.9999
    described = agent_module.describe(config, ["embedding"], MACHINE, [MINILM], agent.registration,
                                      executor["hardware"]["precision"])
    assert f"precision:   {MINILM} on torch {choice.precision} (cosine" in described
