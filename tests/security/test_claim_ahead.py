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


