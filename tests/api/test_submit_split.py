"""Submission is one SQL function (sql/schema/04_tasks.sql); a small inline task is split in the
same transaction, a big one is left to the splitter."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from minions.db.connect import connect
from minions.services.api.appkeys import WAITERS
from minions.services.api.leasing.claim_waiters import ClaimWaiters
from tests.support.api import running_api

RECORDS = [{"id": f"r{i}", "ms": 1} for i in range(7)]


def _task(name: str, subtask_size: int = 3) -> dict[str, object]:
    return {"team": "search", "project": "ranker", "name": name, "kind": "sleep", "subtask_size": subtask_size,
            "input": {"records": RECORDS}}


async def test_a_small_task_is_claimable_on_submit_a_big_one_waits_for_the_splitter(
        database_url: str, tmp_path: Path) -> None:
    conn = await connect(database_url)
    await conn.execute("UPDATE minion_settings SET value = '5' WHERE key = 'max_attempts'")
    async with running_api(database_url, tmp_path / "small", inline_split_max_bytes=1024) as api:
        small = await api.call("POST", "/api/v1/tasks", json=_task("small"))
        assert small.status == 201 and small.body["status"] == "queued"
        assert small.body["subtasks"] == {"total": 3, "pending": 3, "leased": 0, "running": 0, "checking": 0, "done": 0,
                                          "failed": 0, "cancelled": 0}
        rows = await conn.fetch(
            """SELECT s.first_record, s.records, s.byte_start, s.byte_end, t.max_attempts, t.split_records
                 FROM subtasks s JOIN tasks t ON t.id = s.task_id WHERE t.name = 'small' ORDER BY s.subtask_id""")
        assert [(r["first_record"], r["records"]) for r in rows] == [(0, 3), (3, 3), (6, 1)]
        assert rows[0]["byte_start"] == 0 and all(a["byte_end"] == b["byte_start"] for a, b in itertools.pairwise(rows))
        # Submitted without max_attempts: the cluster's value (minion_max_attempts()).
        assert {(r["max_attempts"], r["split_records"]) for r in rows} == {(5, 7)}
        again = await api.call("POST", "/api/v1/tasks", json=_task("small"))
        assert again.status == 200 and again.body["created_at"] == small.body["created_at"]
    async with running_api(database_url, tmp_path / "big", inline_split_max_bytes=16) as api:
        big = await api.call("POST", "/api/v1/tasks", json=_task("big"))
        assert big.status == 201 and big.body["status"] == "submitted" and big.body["subtasks"]["total"] == 0
        assert await conn.fetchval("SELECT count(*) FROM subtasks s JOIN tasks t ON t.id = s.task_id "
                                   "WHERE t.name = 'big'") == 0
    await conn.close()


async def test_a_task_split_at_submission_is_inserted_split_and_wakes_no_splitter(database_url: str) -> None:
    """sql/schema/04_tasks.sql: one insert of the task, split, with the counters the splitter's three steps left; the
    'tasks' NOTIFY is only for a task the splitter has to split."""
    conn = await connect(database_url)
    heard: list[str] = []
    await conn.add_listener("tasks", lambda *args: heard.append(args[3]))
    submit = """SELECT * FROM minion_submit_task('search', 'ranker', $1, 'sleep', 'sleep', '{}', 7, 3, NULL,
                                                 'file:///in.jsonl', 'h', NULL, $2, $3, $4, $5)"""
    try:
        split = await conn.fetchrow(submit, "at-insert", [0, 30, 60], [30, 60, 70], [0, 3, 6], [3, 3, 1])
        unsplit = await conn.fetchrow(submit, "for-the-splitter", None, None, None, None)
        assert (split["status"], split["split_done"], split["open_subtasks"], split["subtasks_total"],
                split["split_offset"], split["split_records"]) == ("queued", True, 3, 3, 70, 7)
        assert (unsplit["status"], unsplit["split_done"], unsplit["open_subtasks"], unsplit["split_records"]) \
            == ("submitted", False, 0, 0)
        rows = await conn.fetch("SELECT subtask_id, capability, priority, state, byte_start, byte_end, first_record, "
                                "records FROM subtasks WHERE task_id = $1 ORDER BY subtask_id", split["id"])
        capability = await conn.fetchval("SELECT minion_capability('sleep', 'sleep')")
        assert [tuple(r) for r in rows] == [(0, capability, 7, "pending", 0, 30, 0, 3),
                                            (1, capability, 7, "pending", 30, 60, 3, 3),
                                            (2, capability, 7, "pending", 60, 70, 6, 1)]
        for _ in range(100):  # delivered in commit order: the split task's would come first
            if heard:
                break
            await asyncio.sleep(0.02)
        assert heard == [str(unsplit["id"])]
    finally:
        await conn.close()


async def test_a_submission_split_here_wakes_this_processs_waiting_claims_itself(
        database_url: str, tmp_path: Path) -> None:
    """Without waiting for the NOTIFY's round trip: with the API's LISTEN stopped, a claim waiting for
    the task's capability is woken by the submission alone, one waiting for another is not."""
    conn = await connect(database_url)
    capability = await conn.fetchval("SELECT minion_capability('sleep', 'sleep')")
    await conn.close()
    async with running_api(database_url, tmp_path, inline_split_max_bytes=1024) as api:
        waiters = api.app[WAITERS]
        await waiters.stop()  # no notification reaches this process any more
        with waiters.registered(frozenset({capability})) as same, \
                waiters.registered(frozenset({"embedding:other"})) as other:
            reply = await api.call("POST", "/api/v1/tasks", json=_task("woken"))
            assert reply.status == 201 and reply.body["subtasks"]["pending"] == 3
            assert same.event.is_set() and not other.event.is_set()


async def test_an_interactive_request_wakes_this_processs_waiting_claims_itself(
        database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lane's request (POST /v1/embeddings) likewise: with the API hearing its `subtasks`
    NOTIFYs but ignoring them, a claim waiting here gets the request's subtask at once, not at the
    end of its wait."""
    monkeypatch.setattr(ClaimWaiters, "_on_notify", lambda self, payload: None)
    async with running_api(database_url, tmp_path) as api:
        executor = await api.register("emb", kinds=["embedding"], models=["m"])
        claim = asyncio.create_task(api.call("POST", f"/api/v1/executors/{executor}/claim?wait=25&max=1",
                                             token="executor"))
        await asyncio.sleep(0.5)  # waiting in its long poll
        request = asyncio.create_task(api.call("POST", "/v1/embeddings", json={"model": "m", "input": "hi"}))
        reply = await asyncio.wait_for(claim, 10)
        assert reply.status == 200, reply.body
        [lease] = reply.body["leases"]
        assert (lease["subtask"]["kind"], lease["subtask"]["model"]) == ("embedding", "m")
        # Failed for good, so the request answers at once rather than at the server's shutdown.
        failed = await api.call("POST", f"/api/v1/leases/{lease['lease']['token']}/fail", token="executor",
                                json={"error": "a test executor", "retryable": False})
        assert failed.status == 200, failed.body
        assert (await asyncio.wait_for(request, 10)).status == 502
