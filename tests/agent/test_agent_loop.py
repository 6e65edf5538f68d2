"""The agent's loop against FakeApi: complete, fail, release when the owner returns, drop a lost
lease, and stop cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agents.macos import agent as agent_module
from agents.macos.agent import Agent
from agents.macos.client import ExecutorClient
from agents.macos.config import PolicyConfig, build
from agents.macos.hardware import Hardware
from agents.macos.policy import OwnerPolicy
from agents.macos.protocol import Subtask
from agents.macos.runners.base import Record, Runner
from agents.macos.runners.sleep import SleepRunner
from minions.backoff import Backoff
from tests.agent.fake_api import FakeApi
from tests.agent.local_http import serving

ROOT = Path(__file__).resolve().parents[2]
MACHINE = Hardware(os="Linux test", chip="test", memory_gb=1, device="cpu", cpu_count=2)


class ExplodingRunner:
    kind = "embedding"

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        raise RuntimeError("MPS backend out of memory")

    async def advertised_models(self) -> list[str]:
        return []

    async def aclose(self) -> None:
        return None


class Harness:
    def __init__(self, fake: FakeApi, agent: Agent, owner: dict[str, float], awake: list[str]) -> None:
        self.fake, self.agent, self.owner, self.awake = fake, agent, owner, awake


@contextlib.asynccontextmanager
async def running_agent(**fake_options: Any) -> AsyncIterator[Harness]:
    fake = FakeApi(**fake_options)
    owner = {"load": 0.0}  # the owner "comes back" when the load goes over max_load
    awake: list[str] = []

    @contextlib.asynccontextmanager
    async def keep_awake() -> AsyncIterator[None]:
        awake.append("on")
        try:
            yield
        finally:
            awake.append("off")

    config = build({"token": "tok", "name": "test-box", "prefer": ["search/ranker"]})
    runners: dict[str, Runner] = {"sleep": SleepRunner(), "embedding": ExplodingRunner()}
    policy = OwnerPolicy(PolicyConfig(max_load=1.0), "Linux", load_average=lambda: owner["load"])
    async with serving(fake.app()) as url:
        fake.url = url
        async with ExecutorClient(url, "tok", backoff=Backoff(0.01, 0.05, rng=random.Random(0))) as client:
            agent = Agent(
                config,
                client,
                runners,
                policy,
                MACHINE,
                ["m1"],
                keep_awake=keep_awake,
                policy_poll_s=0.05,
                idle_poll_s=0.05,
            )
            task = asyncio.create_task(agent.run())
            try:
                yield Harness(fake, agent, owner, awake)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


async def test_registers_then_completes_a_subtask_in_order() -> None:
    async with running_agent() as h:
        records = [{"id": f"r{i}", "ms": i} for i in range(5)]
        token = h.fake.add_subtask("sleep", records)
        await h.fake.wait_until(lambda: "complete" in h.fake.names())
        await h.fake.wait_until(lambda: any(n == "heartbeat" for n in h.fake.names()))
    register = h.fake.events[0]
    assert register[0] == "register"
    assert register[1]["kinds"] == ["sleep", "embedding"] and register[1]["models"] == ["m1"]
    assert register[1]["preferences"] == [{"team": "search", "project": "ranker", "task_name": None}]
    assert register[1]["hardware"]["device"] == "cpu"
    assert h.fake.output(token) == [{"id": f"r{i}", "slept_ms": i} for i in range(5)]
    complete = next(body for name, body in h.fake.events if name == "complete")
    assert complete[0] == token and complete[1]["records"] == 5 and complete[1]["seconds"] >= 0
    assert h.awake == ["on", "off"]
    assert h.fake.names()[-1] == "deregister"  # on the way out
    assert h.agent.completed == 1


async def test_runner_errors_fail_the_lease() -> None:
    async with running_agent() as h:
        crash = h.fake.add_subtask("embedding", [{"id": 1, "text": "x"}], model="m1")
        unknown_kind = h.fake.add_subtask("completion", [{"id": 1, "prompt": "x"}], model="m1")
        bad_count = h.fake.add_subtask("sleep", [{"id": 1, "ms": 1}], count=2)
        bad_record = h.fake.add_subtask("sleep", [{"id": 1, "ms": "soon"}])
        await h.fake.wait_until(lambda: h.fake.names().count("fail") == 4)
    fails = {token: body for name, (token, body) in ((n, b) for n, b in h.fake.events if n == "fail")}
    assert fails[crash]["retryable"] is True and "out of memory" in fails[crash]["error"]
    assert fails[unknown_kind]["retryable"] is False and "does not serve kind" in fails[unknown_kind]["error"]
    assert fails[bad_count]["retryable"] is False and "holds 1 records" in fails[bad_count]["error"]
    assert fails[bad_record]["retryable"] is False
    assert "complete" not in h.fake.names()


async def test_owner_back_releases_at_once() -> None:
    async with running_agent() as h:
        token = h.fake.add_subtask("sleep", [{"id": 1, "ms": 30_000}])
        await h.fake.wait_until(lambda: "claim" in h.fake.names())
        started = time.monotonic()
        h.owner["load"] = 5.0
        await h.fake.wait_until(lambda: "release" in h.fake.names())
        assert time.monotonic() - started < 2
        # While the owner is busy, nothing more is claimed; afterwards work resumes.
        h.fake.add_subtask("sleep", [{"id": 2, "ms": 1}])
        await asyncio.sleep(0.3)
        assert h.fake.names().count("claim") == 1
        h.owner["load"] = 0.0
        await h.fake.wait_until(lambda: "complete" in h.fake.names())
    assert h.fake.states[token] == "released"
    assert h.awake[:2] == ["on", "off"]


@pytest.mark.parametrize("state", ["cancelled", "lost"])
async def test_heartbeat_answer_drops_the_work(state: str) -> None:
    async with running_agent() as h:
        token = h.fake.add_subtask("sleep", [{"id": 1, "ms": 30_000}])
        await h.fake.wait_until(lambda: ("heartbeat", [token]) in h.fake.events)
        h.fake.states[token] = state
        await h.fake.wait_until(lambda: h.agent.held_leases() == [])
        await asyncio.sleep(0.2)
    names = h.fake.names()
    assert not {"complete", "release", "fail", "complete_refused"} & set(names)


async def test_late_complete_is_refused_and_the_agent_goes_on() -> None:
    async with running_agent(heartbeat_interval_s=30) as h:
        first = h.fake.add_subtask("sleep", [{"id": 1, "ms": 300}])
        await h.fake.wait_until(lambda: "claim" in h.fake.names())
        h.fake.states[first] = "lost"  # reclaimed by the watchdog meanwhile; no heartbeat told us
        second = h.fake.add_subtask("sleep", [{"id": 2, "ms": 1}])
        await h.fake.wait_until(lambda: "complete" in h.fake.names())
    assert ("complete_refused", first) in h.fake.events
    assert h.fake.states[second] == "done"


def _spawn_agent(url: str, token: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "MINIONS_TOKEN": token, "HOME": "/nonexistent-home"}
    argv = [
        sys.executable,
        "-m",
        "agents.macos",
        "--api-url",
        url,
        "--kind",
        "sleep",
        "--no-idle-check",
        "--no-ac-check",
        "--no-thermal-check",
        "--name",
        "sub",
    ]
    return asyncio.create_subprocess_exec(  # type: ignore[return-value]
        *argv, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def test_sigterm_releases_deregisters_and_exits_0() -> None:
    fake = FakeApi(heartbeat_interval_s=0.2)
    async with serving(fake.app()) as url:
        fake.url = url
        token = fake.add_subtask("sleep", [{"id": 1, "ms": 60_000}])
        proc = await _spawn_agent(url, "tok")
        await fake.wait_until(lambda: "claim" in fake.names(), timeout_s=30)
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 10)
        assert time.monotonic() - stopped < 5
    assert proc.returncode == 0, stderr.decode()
    assert b"registered as exec-1" in stdout and b"kinds:       sleep" in stdout
    assert fake.states[token] == "released"
    assert fake.names()[-1] == "deregister"


async def test_refused_token_exits_78_with_a_clear_message() -> None:
    fake = FakeApi()
    async with serving(fake.app()) as url:
        proc = await _spawn_agent(url, "wrong")
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == agent_module.EXIT_CONFIG
    assert b"refused this agent's token" in stderr and b"MINIONS_TOKEN" in stderr


async def test_rejected_registration_exits_78() -> None:
    fake = FakeApi()
    fake.register_error = {
        "error": {"code": "invalid", "message": "invalid values", "fields": {"preferences[0].team": "scoped"}}
    }
    async with serving(fake.app()) as url:
        proc = await _spawn_agent(url, "tok")
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == agent_module.EXIT_CONFIG
    assert b"rejected this agent's registration" in stderr and b"422" in stderr
