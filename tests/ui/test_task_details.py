"""GET /api/v1/tasks/{team}/{project}/{name}/subtasks (the web UI's task page) and the static app's
routes, against a real database: pages, lease holders, attempt history, visibility, bad input."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token
from tests.support.api import ApiHarness, running_api

SUBTASKS = "/api/v1/tasks/search/ranker/details/subtasks"


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[ApiHarness]:
    async with running_api(database_url, tmp_path / "store") as harness:
        yield harness


async def _claim(conn: asyncpg.Connection, executor: uuid.UUID, task_id: int, subtask_id: int) -> uuid.UUID:
    """Claims exactly `subtask_id` (the claim picks at random among the head's first pending subtasks, so
    the test puts this one alone at the head of the queue)."""
    await conn.execute("UPDATE subtasks SET priority = 100 + $3 WHERE task_id = $1 AND subtask_id = $2",
                       task_id, subtask_id, subtask_id)
    row = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", executor)
    assert row["subtask_id"] == subtask_id
    token: uuid.UUID = row["lease_token"]
    return token


async def _scenario(database_url: str) -> None:
    """Five subtasks: #0 failed once then done on ex-b, #1 leased by ex-a, the rest pending."""
    conn = await connect(database_url)
    try:
        _, token_id = await make_token(conn, "executor")
        task_id = await make_task(conn, name="details", subtasks=5, max_attempts=3)
        ex_a = await make_executor(conn, token_id, name="ex-a")
        ex_b = await make_executor(conn, token_id, name="ex-b")
        lease = await _claim(conn, ex_a, task_id, 0)
        assert await conn.fetchval("SELECT minion_fail($1, 'CUDA out of memory', true)", lease) == "ok"
        lease = await _claim(conn, ex_b, task_id, 0)
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.25)", lease) == "ok"
        await _claim(conn, ex_a, task_id, 1)
    finally:
        await conn.close()


async def test_subtasks_with_lease_holder_and_history(api: ApiHarness, database_url: str) -> None:
    await _scenario(database_url)
    reply = await api.call("GET", SUBTASKS)
    assert reply.status == 200, reply.body
    assert reply.body["next"] is None
    subs = reply.body["subtasks"]
    assert [s["subtask_id"] for s in subs] == [0, 1, 2, 3, 4]
    assert [s["state"] for s in subs] == ["done", "leased", "pending", "pending", "pending"]

    done = subs[0]
    assert done["executor"] is None and done["attempts"] == 2 and done["records"] == 1
    assert done["done_at"] is not None and done["last_error"] == "CUDA out of memory"
    assert [(h["attempt"], h["executor"], h["outcome"], h["error"]) for h in done["history"]] == [
        (1, "ex-a", "failed", "CUDA out of memory"), (2, "ex-b", "done", None)]
    assert done["history"][1]["seconds"] == 0.25
    assert all(h["started_at"] and h["ended_at"] for h in done["history"])

    leased = subs[1]
    assert leased["executor"] == "ex-a" and leased["leased_at"] is not None and leased["attempts"] == 1
    [running] = leased["history"]
    assert (running["attempt"], running["executor"], running["outcome"], running["ended_at"]) == (1, "ex-a", "running",
                                                                                                   None)
    assert running["seconds"] >= 0

    assert subs[2] == {"subtask_id": 2, "state": "pending", "records": 1, "attempts": 0, "executor": None,
                       "leased_at": None, "done_at": None, "last_error": None, "history": []}


async def test_subtasks_are_paged_in_input_order(api: ApiHarness, database_url: str) -> None:
    await _scenario(database_url)
    seen: list[int] = []
    after: str | None = None
    pages = 0
    while True:
        query = f"?limit=2{'&after=' + after if after else ''}"
        reply = await api.call("GET", SUBTASKS + query)
        assert reply.status == 200, reply.body
        seen += [s["subtask_id"] for s in reply.body["subtasks"]]
        after = reply.body["next"]
        pages += 1
        if after is None:
            break
    assert seen == [0, 1, 2, 3, 4] and pages == 3


async def test_subtasks_bad_queries_are_422(api: ApiHarness, database_url: str) -> None:
    await _scenario(database_url)
    for query, field in (("?limit=0", "limit"), ("?limit=1001", "limit"), ("?limit=x", "limit"),
                         ("?after=-3", "after"), ("?after=abc", "after"), ("?after=99999999999", "after")):
        reply = await api.call("GET", SUBTASKS + query)
        assert reply.status == 422, (query, reply.body)
        assert field in reply.error["fields"], (query, reply.body)
    assert (await api.call("GET", SUBTASKS + "?limit=1000")).status == 200


async def test_subtasks_follow_the_task_visibility_rules(api: ApiHarness, database_url: str) -> None:
    await _scenario(database_url)
    conn = await connect(database_url)
    search_user, _ = await make_token(conn, "user", team="search")
    other_user, _ = await make_token(conn, "user", team="ads")
    await conn.close()
    assert (await api.call("GET", SUBTASKS, token=search_user)).status == 200
    hidden = await api.call("GET", SUBTASKS, token=other_user)
    assert hidden.status == 404 and hidden.error["code"] == "not_found"
    assert (await api.call("GET", SUBTASKS, token="executor")).status == 403
    assert (await api.call("GET", SUBTASKS, token=None)).status == 401
    assert (await api.call("GET", "/api/v1/tasks/search/ranker/nope/subtasks")).status == 404


async def test_web_app_is_served_without_a_token(api: ApiHarness) -> None:
    index = await api.call("GET", "/", token=None)
    assert index.status == 200 and index.headers["Content-Type"].startswith("text/html")
    assert "no-cache" in index.headers["Cache-Control"] and "Content-Security-Policy" in index.headers
    assert b"/ui/app.js" in index.body and b"Minions" in index.body
    for path, content_type in (("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css"),
                               ("/ui/favicon.svg", "image/svg+xml")):
        reply = await api.call("GET", path, token=None)
        headers = {k.lower(): v for k, v in reply.headers.items()}
        assert reply.status == 200 and headers["content-type"].startswith(content_type), path
        assert headers["cache-control"] == "no-cache" and headers["etag"]
        again = await api.call("GET", path, token=None, headers={"If-None-Match": headers["etag"]})
        assert again.status == 304 and not again.body, path
    for missing in ("/ui/nope.js", "/ui/", "/ui/.hidden", "/ui/index.html/x"):
        assert (await api.call("GET", missing, token=None)).status == 404, missing
    # Only the app is public: the API behind it still wants a token.
    assert (await api.call("GET", "/api/v1/tasks", token=None)).status == 401
    assert (await api.call("GET", "/index.html", token=None)).status == 401
