"""The HTTP API against a real database: every error status of API.md with its JSON body, long-poll
claims woken by NOTIFY, fenced leases, idempotent submission."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from minions.db.connect import connect
from minions.db.migrate import migrate
from minions.embedded_pg import EmbeddedPostgres
from minions.testing.factories import make_task, make_token
from tests.support.api import ApiHarness, running_api

SLEEP_TASK = {"team": "search", "project": "ranker", "name": "t1", "kind": "sleep",
              "input": {"records": [{"id": "a", "ms": 1}, {"id": "b", "ms": 1}]}}


@pytest.fixture
async def api(database_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    async with running_api(database_url, tmp_path / "store") as harness:
        yield harness


@pytest.fixture
async def object_api(database_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Inline records stored as an input object, as bigger ones are (not kept in the database)."""
    async with running_api(database_url, tmp_path / "store", input_in_database_bytes=0) as harness:
        yield harness


async def test_health_needs_no_token(api: ApiHarness) -> None:
    reply = await api.call("GET", "/api/v1/health", token=None)
    assert (reply.status, reply.body) == (200, {"status": "ok", "database": "ok"})


async def test_401_without_or_with_unknown_token(api: ApiHarness) -> None:
    for token in (None, "not-a-token"):
        reply = await api.call("GET", "/api/v1/tasks", token=token)
        assert reply.status == 401 and reply.error["code"] == "unauthorized"


async def test_400_malformed_json(api: ApiHarness) -> None:
    reply = await api.call("POST", "/api/v1/tasks", data=b"{not json", headers={"Content-Type": "application/json"})
    assert reply.status == 400 and reply.error["code"] == "malformed_json"
    reply = await api.call("POST", "/api/v1/tasks", json=[1, 2])
    assert reply.status == 400 and reply.error["code"] == "malformed_body"


async def test_422_lists_every_invalid_field(api: ApiHarness) -> None:
    reply = await api.call("POST", "/api/v1/tasks", json={
        "team": "bad team!", "project": "p", "name": "n", "kind": "teleport", "subtask_size": 0,
        "input": {"records": []}, "params": [], "colour": "red"})
    assert reply.status == 422
    fields = reply.error["fields"]
    assert {"team", "kind", "model", "subtask_size", "input.records", "params", "colour"} <= set(fields)

    reply = await api.call("POST", "/api/v1/tasks", json={
        **SLEEP_TASK, "input": {"records": [{"id": "a", "ms": 1}, {"id": "a", "ms": 2}, {"ms": 3}]},
        "params": {"normalize": True}})
    assert reply.status == 422
    fields = reply.error["fields"]
    assert "duplicate" in fields["input.records[1]"]
    assert "id" in fields["input.records[2]"]
    assert "params.normalize" in fields


async def test_403_wrong_role_and_wrong_team(api: ApiHarness, database_url: str) -> None:
    reply = await api.call("POST", "/api/v1/tasks", token="executor", json=SLEEP_TASK)
    assert reply.status == 403 and reply.error["code"] == "wrong_role"
    reply = await api.call("POST", "/api/v1/executors/register", token="admin", json={"name": "x", "kinds": ["sleep"]})
    assert reply.status == 201  # admin may do everything
    conn = await connect(database_url)
    other, _ = await make_token(conn, "user", team="ads")
    await conn.close()
    reply = await api.call("POST", "/api/v1/tasks", token=other, json=SLEEP_TASK)
    assert reply.status == 403 and reply.error["code"] == "wrong_team"


async def test_404s_are_json(api: ApiHarness, database_url: str) -> None:
    reply = await api.call("GET", "/api/v1/tasks/a/b/c")
    assert reply.status == 404 and reply.error["code"] == "not_found"
    reply = await api.call("GET", "/api/v1/nothing-here")
    assert reply.status == 404 and reply.error["code"] == "not_found"
    reply = await api.call("POST", "/api/v1/executors/not-a-uuid/claim", token="executor")
    assert reply.status == 404
    # A team-scoped user sees other teams' tasks as absent.
    assert (await api.call("POST", "/api/v1/tasks", json=SLEEP_TASK)).status == 201
    conn = await connect(database_url)
    other, _ = await make_token(conn, "user", team="ads")
    await conn.close()
    reply = await api.call("GET", "/api/v1/tasks/search/ranker/t1", token=other)
    assert reply.status == 404
    assert (await api.call("GET", "/api/v1/tasks", token=other)).body["tasks"] == []


async def test_submission_is_idempotent_and_conflicts_on_a_different_body(api: ApiHarness) -> None:
    first = await api.call("POST", "/api/v1/tasks", json=SLEEP_TASK)
    # Small inline records are split at submission: claimable at once, no splitter hop.
    assert first.status == 201 and first.body["status"] == "queued"
    assert first.body["subtasks"]["pending"] == first.body["subtasks"]["total"] > 0
    again = await api.call("POST", "/api/v1/tasks", json=SLEEP_TASK)
    assert again.status == 200 and again.body["created_at"] == first.body["created_at"]
    different = await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "priority": 3})
    assert different.status == 409 and different.error["code"] == "task_exists"


async def test_placement_is_part_of_the_task_and_checked(api: ApiHarness) -> None:
    """`placement`: any (the default, also for null) or trusted, shown on the task and part of its body
    (a re-submission with another placement is a different task); anything else is 422."""
    first = await api.call("POST", "/api/v1/tasks", json=SLEEP_TASK)
    assert first.status == 201 and first.body["placement"] == "any"
    assert (await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "placement": None})).status == 200
    moved = await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "placement": "trusted"})
    assert moved.status == 409 and moved.error["code"] == "task_exists"
    placed = await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "name": "t2", "placement": "trusted"})
    assert placed.status == 201 and placed.body["placement"] == "trusted"
    assert (await api.call("GET", "/api/v1/tasks/search/ranker/t2")).body["placement"] == "trusted"
    for bad in ("anywhere", "", 1, ["trusted"], {"trusted": True}):
        reply = await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "name": "t3", "placement": bad})
        assert reply.status == 422 and "placement" in reply.error["fields"], (bad, reply.body)


async def test_409_results_before_the_end_and_413_too_large(api: ApiHarness) -> None:
    await api.call("POST", "/api/v1/tasks", json=SLEEP_TASK)
    reply = await api.call("GET", "/api/v1/tasks/search/ranker/t1/results")
    assert reply.status == 409 and reply.error["code"] == "not_finished"
    partial = await api.call("GET", "/api/v1/tasks/search/ranker/t1/results?partial=true")
    assert partial.status == 200 and partial.body == b""
    huge = b'{"team": "' + b"x" * (65 * 1024 * 1024) + b'"}'
    reply = await api.call("POST", "/api/v1/tasks", data=huge, headers={"Content-Type": "application/json"})
    assert reply.status == 413 and reply.error["code"] == "too_large"


async def test_long_poll_is_woken_by_notify_and_times_out_with_204(api: ApiHarness, database_url: str,
                                                                  tmp_path: Path) -> None:
    executor_id = await api.register()
    started = time.monotonic()
    reply = await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=1", token="executor")
    assert reply.status == 204 and 0.9 <= time.monotonic() - started < 3

    claim = asyncio.create_task(api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=30",
                                         token="executor"))
    await asyncio.sleep(1.0)
    assert not claim.done()
    conn = await connect(database_url)
    created = time.monotonic()
    await make_task(conn, subtasks=1, input_uri=(tmp_path / "store" / "inputs" / "x.jsonl").as_uri())
    await conn.close()
    reply = await asyncio.wait_for(claim, 5)
    assert reply.status == 200
    assert time.monotonic() - created < 1.0, "the claim waited for its timeout instead of the NOTIFY"
    lease = reply.body
    assert lease["subtask"]["input"]["range"] == [0, 100] and lease["lease"]["token"]


async def test_stale_lease_gets_409_and_its_output_never_appears(object_api: ApiHarness, tmp_path: Path) -> None:
    api = object_api  # its inline records are an input object
    assert (await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "subtask_size": 2})).status == 201
    conn = await connect(api.settings.database_url)
    # Split inline (the splitter service is tested on its own): one subtask covering both records.
    task_id = await conn.fetchval("SELECT id FROM tasks")
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
    uri = await conn.fetchval("SELECT input_uri FROM tasks WHERE id = $1", task_id)
    length = (await asyncio.to_thread(Path(uri.removeprefix("file://")).stat)).st_size
    await conn.fetchval("SELECT minion_add_subtasks($1, '{0}', $2, '{0}', '{2}', 0, $3, 2)", task_id, [length],
                        length)
    await conn.execute("SELECT minion_finish_split($1)", task_id)
    await conn.close()

    slow = await api.register("slow")
    fast = await api.register("fast")
    first = (await api.call("POST", f"/api/v1/executors/{slow}/claim?wait=0", token="executor")).body
    async with api.session.put(first["subtask"]["output"]["url"],
                               data=b'{"id": "a", "slept_ms": 999}\n{"id": "b", "slept_ms": 999}\n') as resp:
        assert resp.status == 200
    # The slow executor hands it back; the fast one does it.
    assert (await api.call("POST", f"/api/v1/leases/{first['lease']['token']}/release", token="executor")).status == 200
    second = (await api.call("POST", f"/api/v1/executors/{fast}/claim?wait=0", token="executor")).body
    async with api.session.get(second["subtask"]["input"]["url"],
                               headers={"Range": f"bytes=0-{second['subtask']['input']['range'][1] - 1}"}) as resp:
        lines = (await resp.read()).splitlines()
    assert len(lines) == 2
    complete = await api.call("POST", f"/api/v1/leases/{second['lease']['token']}/complete", token="executor",
                              json={"records": 2, "seconds": 0.1})
    assert complete.status == 409 and complete.error["code"] == "output_missing"
    async with api.session.put(second["subtask"]["output"]["url"],
                               data=b'{"id": "a", "slept_ms": 1}\n{"id": "b", "slept_ms": 1}\n') as resp:
        assert resp.status == 200
    complete = await api.call("POST", f"/api/v1/leases/{second['lease']['token']}/complete", token="executor",
                              json={"records": 2, "seconds": 0.1})
    assert complete.status == 200
    stale = await api.call("POST", f"/api/v1/leases/{first['lease']['token']}/complete", token="executor",
                           json={"records": 2, "seconds": 0.1})
    assert stale.status == 409 and stale.error["code"] == "lease_lost"
    heartbeat = await api.call("POST", f"/api/v1/executors/{slow}/heartbeat", token="executor",
                               json={"leases": [first["lease"]["token"], "garbage"]})
    assert heartbeat.body == {"leases": {first["lease"]["token"]: "lost", "garbage": "lost"}}

    task = (await api.call("GET", "/api/v1/tasks/search/ranker/t1")).body
    assert task["status"] == "completed" and task["records"] == {"total": 2, "done": 2}
    results = await api.call("GET", "/api/v1/tasks/search/ranker/t1/results")
    assert results.body == b'{"id": "a", "slept_ms": 1}\n{"id": "b", "slept_ms": 1}\n'


async def test_503_with_retry_after_while_the_database_is_down(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", fast=True)
    pg.start()
    try:
        await migrate(pg.url)
        async with running_api(pg.url, tmp_path / "store") as api:
            assert (await api.call("GET", "/api/v1/health", token=None)).status == 200
            await asyncio.to_thread(pg.stop, "immediate")
            for path in ("/api/v1/health", "/api/v1/tasks"):
                reply = await api.call("GET", path, token=None if "health" in path else "admin")
                assert reply.status == 503 and reply.headers.get("Retry-After"), (path, reply)
                assert reply.error["code"] == "database_unavailable"
            await asyncio.to_thread(pg.start)
            for _ in range(50):
                if (await api.call("GET", "/api/v1/health", token=None)).status == 200:
                    break
                await asyncio.sleep(0.2)
            assert (await api.call("GET", "/api/v1/tasks")).status == 200
    finally:
        pg.stop("immediate")


async def test_a_lease_answers_only_to_its_executors_token(api: ApiHarness, database_url: str,
                                                            tmp_path: Path) -> None:
    conn = await connect(database_url)
    await make_task(conn, subtasks=1, input_uri=(tmp_path / "store" / "inputs" / "x.jsonl").as_uri())
    intruder, _ = await make_token(conn, "executor")
    await conn.close()
    executor_id = await api.register()
    lease = (await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=0", token="executor")).body
    token = lease["lease"]["token"]
    for action in ("fail", "release"):
        reply = await api.call("POST", f"/api/v1/leases/{token}/{action}", token=intruder,
                               json={"error": "x"})
        assert reply.status == 403 and reply.error["code"] == "not_your_lease"
    assert (await api.call("POST", f"/api/v1/leases/{token}/release", token="executor")).status == 200


async def test_identical_submissions_racing_keep_the_winners_input(object_api: ApiHarness) -> None:
    api = object_api  # its inline records are an input object
    replies = await asyncio.gather(*(api.call("POST", "/api/v1/tasks", json=SLEEP_TASK) for _ in range(4)))
    assert sorted(r.status for r in replies) == [200, 200, 200, 201]
    uri = replies[0].body["input_uri"]
    assert await asyncio.to_thread(Path(uri.removeprefix("file://")).exists)


async def test_cancelled_mid_split_results_hold_every_record(object_api: ApiHarness) -> None:
    api = object_api  # its inline records are an input object
    records = [{"id": f"r{i}", "ms": 1} for i in range(10)]
    assert (await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "input": {"records": records},
                                                          "subtask_size": 2})).status == 201
    conn = await connect(api.settings.database_url)
    task_id = await conn.fetchval("SELECT id FROM tasks")
    uri = await conn.fetchval("SELECT input_uri FROM tasks WHERE id = $1", task_id)
    lines = (await asyncio.to_thread(Path(uri.removeprefix("file://")).read_bytes)).splitlines(keepends=True)
    first_two = len(lines[0]) + len(lines[1])
    # The splitter made one subtask of the first two records, then the task was cancelled.
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
    await conn.fetchval("SELECT minion_add_subtasks($1, '{0}', $2, '{0}', '{2}', 0, $3, 2)", task_id,
                        [first_two], first_two)
    await conn.close()
    assert (await api.call("POST", "/api/v1/tasks/search/ranker/t1/cancel")).body["status"] == "cancelled"
    results = await api.call("GET", "/api/v1/tasks/search/ranker/t1/results")
    assert [line for line in results.body.splitlines()] == [
        b'{"id":"r%d","error":"task cancelled"}' % i for i in range(10)]


async def test_fifty_http_claimers_on_a_hundred_subtasks_lease_each_once(api: ApiHarness, database_url: str,
                                                                          tmp_path: Path) -> None:
    conn = await connect(database_url)
    task_id = await make_task(conn, subtasks=100, input_uri=(tmp_path / "store" / "inputs" / "x.jsonl").as_uri())
    await conn.close()
    executors = await asyncio.gather(*(api.register(f"claimer-{i}") for i in range(50)))
    won: list[int] = []

    async def claimer(executor_id: str) -> None:
        while True:
            reply = await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=0", token="executor")
            if reply.status == 204:
                return
            assert reply.status == 200, reply.body
            won.append(reply.body["subtask"]["subtask_id"])

    await asyncio.gather(*(claimer(e) for e in executors))
    assert sorted(won) == list(range(100))
    conn = await connect(database_url)
    assert await conn.fetchval("SELECT count(*) FROM minion_subtask_acquirement WHERE task_id = $1", task_id) == 100
    await conn.close()


async def test_meta_lists_the_kinds_params_and_statuses_the_server_checks(api: ApiHarness) -> None:
    assert (await api.call("GET", "/api/v1/meta", token=None)).status == 401
    reply = await api.call("GET", "/api/v1/meta", token="executor")
    assert reply.status == 200
    meta = reply.body
    assert list(meta["kinds"]) == ["embedding", "completion", "sleep"]
    assert meta["kinds"]["completion"]["default_subtask_size"] == 50
    assert meta["kinds"]["embedding"]["params"]["pooling"] == {"type": "string", "choices": ["mean", "cls"],
                                                               "default": "mean"}
    assert meta["finished_task_statuses"] == ["completed", "failed", "cancelled"]
    assert meta["unsplit_task_statuses"] == ["submitted", "splitting"]
    assert meta["subtask_states"] == ["pending", "leased", "checking", "done", "failed", "cancelled"]
    assert meta["attempt_outcomes"][:3] == ["done", "failed", "lost"] and "outvoted" in meta["attempt_outcomes"]
    assert meta["running_attempt"] == "running"
    assert set(meta["problem_attempt_outcomes"]) < set(meta["attempt_outcomes"])
    # What it says is what a submission is held to: the bound it names is the one the server applies.
    limit = meta["kinds"]["embedding"]["params"]["max_length"]["maximum"]
    for max_length, status in ((limit, 201), (limit + 1, 422)):
        body = {**SLEEP_TASK, "name": f"meta-{max_length}", "kind": "embedding", "model": "m",
                "params": {"max_length": max_length}, "input": {"records": [{"id": 1, "text": "a"}]}}
        assert (await api.call("POST", "/api/v1/tasks", json=body)).status == status
    reply = await api.call("GET", "/api/v1/tasks?status=" + meta["task_statuses"][1])
    assert reply.status == 200


async def test_a_name_with_a_trailing_newline_is_refused(api: ApiHarness) -> None:
    # "$" would match before the newline; minions/names.py's rule ends with \Z (the agent uses it too).
    reply = await api.call("POST", "/api/v1/tasks", json={**SLEEP_TASK, "name": "t1\n"})
    assert reply.status == 422 and "name" in reply.error["fields"]
