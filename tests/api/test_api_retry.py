"""POST /api/v1/tasks/{team}/{project}/{name}/retry as docs/API.md writes it: a failed task running
again (200, the task), 409 with the reason for what cannot be retried, 404 for a task not there or
another team's; and the 409 `task_exists` of a taken name says what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from minions.db.connect import connect
from minions.testing.factories import make_token
from tests.support.api import ApiHarness, running_api

TASK = {"team": "search", "project": "ranker", "name": "t1", "kind": "sleep",
        "input": {"records": [{"id": "a", "ms": 1}, {"id": "b", "ms": 1}]}, "subtask_size": 1}
RETRY = "/api/v1/tasks/search/ranker/t1/retry"


@pytest.fixture
async def api(database_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_api(database_url, tmp_path / "store") as harness:
        yield harness


async def test_retry_over_http(api: ApiHarness) -> None:
    assert (await api.call("POST", "/api/v1/tasks", json=TASK)).status == 201
    refused = await api.call("POST", RETRY)
    assert refused.status == 409 and refused.error["code"] == "task_not_failed"
    assert "search/ranker/t1 is queued" in refused.error["message"], refused.error

    executor = await api.register()
    for _ in range(2):
        claimed = await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=0", token="executor")
        assert claimed.status == 200, claimed.body
    conn = await connect(api.settings.database_url)
    try:
        for token in await conn.fetchval("SELECT array_agg(lease_token) FROM subtasks"):
            assert await conn.fetchval("SELECT minion_fail($1, 'disk full', false)", token) == "ok"
    finally:
        await conn.close()
    failed = await api.call("GET", "/api/v1/tasks/search/ranker/t1")
    assert failed.body["status"] == "failed" and failed.body["subtasks"]["failed"] == 2

    other_team = await _token_of(api, "ads")
    assert (await api.call("POST", RETRY, token=other_team)).status == 404  # another team's: not there
    assert (await api.call("POST", "/api/v1/tasks/search/ranker/nope/retry")).status == 404
    retried = await api.call("POST", RETRY)
    assert retried.status == 200, retried.body
    assert (retried.body["status"], retried.body["error"]) == ("running", None)
    assert (retried.body["subtasks"]["pending"], retried.body["subtasks"]["failed"]) == (2, 0)

    changed = await api.call("POST", "/api/v1/tasks", json={**TASK, "priority": 3})
    assert changed.status == 409 and changed.error["code"] == "task_exists"
    assert "another name" in changed.error["message"] and "--replace" in changed.error["message"]


async def _token_of(api: ApiHarness, team: str) -> str:
    conn = await connect(api.settings.database_url)
    try:
        token, _ = await make_token(conn, "user", team)
    finally:
        await conn.close()
    return token
