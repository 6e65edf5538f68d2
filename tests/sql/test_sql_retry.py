"""minion_retry_task, called as an operator would from psql: a failed task's failed subtasks go back
to the queue with a fresh budget of attempts (waking the executors), its committed results stay,
and it ends again like any task; anything but a failed task is refused with the reason."""

from __future__ import annotations

import asyncio

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token

RETRY = "SELECT verdict, subtasks FROM minion_retry_task($1)"
COUNTS = "SELECT * FROM minion_task_counts($1)"


async def _claim(conn: asyncpg.Connection, executor: object) -> asyncpg.Record:
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", executor)
    assert lease is not None
    return lease


async def test_a_failed_task_runs_its_failed_subtasks_again_and_keeps_its_results(database_url: str) -> None:
    conn = await connect(database_url)
    listener = await connect(database_url)
    try:
        _, token_id = await make_token(conn, "executor")
        executor = await make_executor(conn, token_id)
        task_id = await make_task(conn, subtasks=3, max_attempts=2)
        leases = [await _claim(conn, executor) for _ in range(3)]
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", leases[0]["lease_token"]) == "ok"
        for lease in leases[1:]:  # not retryable: failed for good at once
            assert await conn.fetchval("SELECT minion_fail($1, 'bad record', false)", lease["lease_token"]) == "ok"
        task = await conn.fetchrow("SELECT status, error FROM tasks WHERE id = $1", task_id)
        assert task["status"] == "failed" and "bad record" in task["error"]
        kept = await conn.fetchrow("SELECT output_key FROM subtasks WHERE task_id = $1 AND subtask_id = 0", task_id)

        woken: asyncio.Queue[str] = asyncio.Queue()
        await listener.add_listener("subtasks", lambda *args: woken.put_nowait(args[3]))
        assert tuple(await conn.fetchrow(RETRY, task_id)) == ("retried", 2)
        assert await asyncio.wait_for(woken.get(), 30) == "sleep:*"  # executors long-polling wake up

        task = await conn.fetchrow("SELECT status, error, finished_at FROM tasks WHERE id = $1", task_id)
        assert (task["status"], task["error"], task["finished_at"]) == ("running", None, None)
        counts = await conn.fetchrow(COUNTS, task_id)
        assert (counts["subtasks_done"], counts["subtasks_pending"], counts["subtasks_failed"]) == (1, 2, 0)
        rows = await conn.fetch("SELECT subtask_id, state, attempts, output_key FROM subtasks WHERE task_id = $1 "
                                "ORDER BY subtask_id", task_id)
        assert [(r["state"], r["attempts"]) for r in rows] == [("done", 1), ("pending", 0), ("pending", 0)]
        assert rows[0]["output_key"] == kept["output_key"]  # the committed result is untouched
        # The earlier attempts stay in the history.
        assert await conn.fetchval("SELECT count(*) FROM subtask_attempts WHERE task_id = $1 AND outcome = 'failed'",
                                   task_id) == 2

        assert tuple(await conn.fetchrow(RETRY, task_id)) == ("not_failed", 0)  # running: nothing to do
        # A fresh budget: each may fail once (retryably) and still run again, max_attempts being 2.
        first = [await _claim(conn, executor) for _ in range(2)]
        for lease in first:
            assert await conn.fetchval("SELECT minion_fail($1, 'flaky', true)", lease["lease_token"]) == "ok"
        for _ in range(2):
            lease = await _claim(conn, executor)
            assert lease["attempt"] == 2
            assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", lease["lease_token"]) == "ok"
        task = await conn.fetchrow("SELECT status, error FROM tasks WHERE id = $1", task_id)
        assert (task["status"], task["error"]) == ("completed", None)
        counts = await conn.fetchrow(COUNTS, task_id)
        assert (counts["subtasks_done"], counts["subtasks_failed"], counts["records_done"]) == (3, 0, 3)
        assert tuple(await conn.fetchrow(RETRY, task_id)) == ("not_failed", 0)
    finally:
        await listener.close()
        await conn.close()


async def test_retry_refuses_what_it_cannot_retry(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        assert tuple(await conn.fetchrow(RETRY, 987654)) == ("missing", 0)
        queued = await make_task(conn, subtasks=1)
        assert tuple(await conn.fetchrow(RETRY, queued)) == ("not_failed", 0)
        assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", queued) == "queued"
        unsplittable = await make_task(conn, subtasks=1)
        await conn.execute("SELECT minion_fail_split($1, 'line 3: not JSON')", unsplittable)
        assert tuple(await conn.fetchrow(RETRY, unsplittable)) == ("nothing_to_retry", 0)
        task = await conn.fetchrow("SELECT status, error FROM tasks WHERE id = $1", unsplittable)
        assert (task["status"], task["error"]) == ("failed", "line 3: not JSON")
    finally:
        await conn.close()
