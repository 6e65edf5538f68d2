"""Claim-ahead strands no more work than the subtasks' duration calls for.

A pipelined agent claims the next subtasks while one runs; every lease it holds is work a Mac that
vanishes strands until the lease timeout. The agent's own loop (tests/agent/test_agent_loop.py's
harness: the real API on a real port over a real database) holds one lease beyond the one running
for subtasks longer than its round trips, and pipelines short ones as deep as
agents/macos/claim_depth.py's rule says for what it measured.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minions.agents.macos.claim_depth import depth_for
from minions.agents.macos.client import ExecutorClient
from minions.agents.macos.protocol import Claim
from minions.testing.waiting import eventually
from tests.agent.test_agent_loop import Harness, World, running_agent, world


async def _most_held_while_running(w: World, h: Harness, name: str) -> int:
    """The most leases the agent held at once, sampled every 5 ms until task `name` completed."""
    most = 0
    while not await w.status_is(name, "completed"):
        for _ in range(20):
            most = max(most, len(h.agent.held_leases()))
            await asyncio.sleep(0.005)
    return most


async def test_claim_ahead_is_as_deep_as_the_subtasks_duration_calls_for(
        database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Heartbeats 10 s apart, so the heartbeat's cap allows deep pipelines (the bound before this
    rule, a heartbeat interval's work, held all of these 1.5 s subtasks at once). Long subtasks (their run time
    above the round trips of claim, fetch and complete, even on a loaded machine) hold one lease beyond the one
    running; short ones
    pipeline, each as deep as agents/macos/claim_depth.py's rule says for what the agent measured."""
    async with world(database_url, tmp_path, caplog, heartbeat_interval_s=10.0) as w, running_agent(w) as h:
        await w.submit("long", "sleep", [{"id": i, "ms": 1500} for i in range(4)], subtask_size=1)
        assert await _most_held_while_running(w, h, "long") <= 2
        measured = h.agent.claim_depth()
        assert measured.run_s is not None and measured.run_s >= 1.5
        assert measured.round_trip_s is not None and measured.round_trip_s < measured.run_s, measured
        assert h.agent.lease_bound() == 2

        await w.submit("short", "sleep", [{"id": i, "ms": 0} for i in range(300)], subtask_size=1)
        assert await _most_held_while_running(w, h, "short") > 2
        measured = h.agent.claim_depth()
        assert measured.run_s is not None and measured.run_s < 0.05
        assert h.agent.lease_bound() == depth_for(measured.run_s, measured.round_trip_s, measured.claim_s,
                                                 measured.cap) > 2
        assert [a["outcome"] for a in await w.conn.fetch("SELECT outcome FROM subtask_attempts")] == ["done"] * 304




class _SlowClaimsAhead(ExecutorClient):
    """The real client, but a claim sent ahead (`wait=0`: the device has work) is answered only after
    the work in hand has long ended: the answer comes back empty to an agent that holds nothing."""

    async def claim_batch(self, executor_id: str, wait_s: float, most: int) -> list[Claim]:
        claims = await super().claim_batch(executor_id, wait_s, most)
        if wait_s == 0:
            await asyncio.sleep(0.5)
        return claims


async def test_an_empty_claim_ahead_after_the_last_job_left_does_not_stall_the_agent(
        database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """After a claim ahead found the queue empty the agent waits for a job to move before it claims
    again; had the last job left while that claim was in flight, nothing would ever move, and the
    agent would sit idle forever beside new work. It long-polls instead: each new task completes."""
    async with world(database_url, tmp_path, caplog) as w, running_agent(w, client_type=_SlowClaimsAhead):
        for n in range(3):
            name = f"one-{n}"
            await w.submit(name, "sleep", [{"id": 0, "ms": 100}], subtask_size=1)
            await eventually(lambda name=name: w.status_is(name, "completed"), f"{name} to complete", timeout_s=20)
