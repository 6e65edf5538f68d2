"""A task's `subtasks.running` (API.md): of its leased subtasks, those being worked on now. An agent
claims ahead of its work and runs one lease at a time, the oldest; the others are claimed ahead."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.api import ApiHarness, running_api

TASK = {"team": "search", "project": "ranker", "name": "twelve", "kind": "sleep", "subtask_size": 1,
        "input": {"records": [{"id": i, "ms": 1} for i in range(12)]}}
PATH = "/api/v1/tasks/search/ranker/twelve"


@pytest.fixture
async def api(database_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_api(database_url, tmp_path / "store") as harness:
        yield harness


async def _claim(api: ApiHarness, executor_id: str) -> str:
    reply = await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=0", token="executor")
    assert reply.status == 200, reply.body
    token: str = reply.body["lease"]["token"]
    return token


async def _subtasks(api: ApiHarness) -> dict[str, int]:
    reply = await api.call("GET", PATH)
    assert reply.status == 200
    subtasks: dict[str, int] = reply.body["subtasks"]
    return subtasks


async def test_leases_claimed_ahead_are_not_counted_as_running(api: ApiHarness) -> None:
    assert (await api.call("POST", "/api/v1/tasks", json=TASK)).status == 201
    assert (await _subtasks(api))["running"] == 0

    one = await api.register("one")
    tokens = [await _claim(api, one) for _ in range(11)]
    counts = await _subtasks(api)
    assert (counts["leased"], counts["running"], counts["pending"]) == (11, 1, 1)

    two = await api.register("two")
    await _claim(api, two)
    counts = await _subtasks(api)
    assert (counts["leased"], counts["running"]) == (12, 2)

    # The first executor hands back the lease it worked on: its next one runs now.
    assert (await api.call("POST", f"/api/v1/leases/{tokens[0]}/release", token="executor")).status == 200
    counts = await _subtasks(api)
    assert (counts["leased"], counts["running"]) == (11, 2)

    listed = await api.call("GET", "/api/v1/tasks?team=search")
    assert listed.body["tasks"][0]["subtasks"]["running"] == 2
