"""Submission is one SQL function (sql/181_submit_task.sql); a small inline task is split in the
same transaction, a big one is left to the splitter."""

from __future__ import annotations

import itertools
from pathlib import Path

from minions.db.connect import connect
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
        assert small.body["subtasks"] == {"total": 3, "pending": 3, "leased": 0, "done": 0, "failed": 0,
                                          "cancelled": 0}
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
