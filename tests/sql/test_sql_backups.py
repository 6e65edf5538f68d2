"""Straggler backup in SQL: a copy of a slow lease near the end of a task; the first complete wins."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token, silence

# A lease's referee row goes with the lease, whichever copy completes (minion_complete deletes it by
# the subtask's lease token, which a backup's completion must find too).
REFEREE_ROWS = "SELECT count(*) FROM minion_subtask_acquirement WHERE task_id = $1"


async def _straggling(database_url: str) -> tuple[asyncpg.Connection, int, uuid.UUID, dict, uuid.UUID]:
    """Three quick subtasks done by `fast`, the fourth held by `slow`; returns a third executor."""
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor")
    task_id = await make_task(conn, subtasks=4)
    fast, slow, spare = [await make_executor(conn, token_id, name=n) for n in ("fast", "slow", "spare")]
    leases = [await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", fast) for _ in range(3)]
    straggler = dict(await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", slow))
    for lease in leases:
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", lease["lease_token"]) == "ok"
    return conn, task_id, slow, straggler, spare


async def test_no_backup_before_the_lease_runs_long(database_url: str) -> None:
    conn, _, _, _, spare = await _straggling(database_url)
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 1000000)", spare) is None
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 0)", spare) is None  # 0: off
    await conn.close()


async def test_backup_wins_and_the_straggler_goes_stale(database_url: str) -> None:
    conn, task_id, slow, straggler, spare = await _straggling(database_url)
    await asyncio.sleep(0.3)
    backup = await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 4)", spare)
    assert backup["backup"] and backup["subtask_id"] == straggler["subtask_id"]
    assert backup["output_key"] != straggler["output_key"]
    # Only one backup per subtask.
    _, token_id = await make_token(conn, "executor")
    another = await make_executor(conn, token_id)
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 4)", another) is None
    beats = await conn.fetch("SELECT * FROM minion_heartbeat($1, $2)", spare, [backup["lease_token"]])
    assert beats[0]["state"] == "ok"
    assert await conn.fetchval("SELECT minion_lease_count($1)", spare) == 1

    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", backup["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT minion_complete($1, 1, 9.9)", straggler["lease_token"]) == "lost"
    beats = await conn.fetch("SELECT * FROM minion_heartbeat($1, $2)", slow, [straggler["lease_token"]])
    assert beats[0]["state"] == "lost"
    sub = await conn.fetchrow("SELECT state, output_key FROM subtasks WHERE task_id = $1 AND subtask_id = $2",
                              task_id, straggler["subtask_id"])
    assert sub["state"] == "done" and sub["output_key"] == backup["output_key"]
    outcomes = await conn.fetch(
        "SELECT outcome FROM subtask_attempts WHERE task_id = $1 AND subtask_id = $2 ORDER BY outcome",
        task_id, straggler["subtask_id"])
    assert [o["outcome"] for o in outcomes] == ["done", "superseded"]
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    assert await conn.fetchval("SELECT count(*) FROM subtask_backups") == 0
    assert await conn.fetchval(REFEREE_ROWS, task_id) == 0
    await conn.close()


async def test_straggler_finishing_first_makes_the_backup_stale(database_url: str) -> None:
    conn, task_id, _, straggler, spare = await _straggling(database_url)
    await asyncio.sleep(0.3)
    backup = await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 4)", spare)
    assert await conn.fetchval("SELECT minion_complete($1, 1, 1)", straggler["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT minion_complete($1, 1, 1)", backup["lease_token"]) == "lost"
    beats = await conn.fetch("SELECT * FROM minion_heartbeat($1, $2)", spare, [backup["lease_token"]])
    assert beats[0]["state"] == "lost"
    assert await conn.fetchval("SELECT minion_lease_count($1)", spare) == 0
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    assert await conn.fetchval(REFEREE_ROWS, task_id) == 0
    await conn.close()


async def test_lost_straggler_hands_its_lease_to_the_running_backup(database_url: str) -> None:
    conn, task_id, slow, _, spare = await _straggling(database_url)
    await asyncio.sleep(0.3)
    backup = await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 4)", spare)
    await silence(conn, slow, 300)
    assert await conn.fetchval("SELECT minion_reclaim_executor($1, 60)", slow) == 1
    # Nothing was requeued: the backup carries on as the lease.
    assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND state = 'pending'",
                               task_id) == 0
    assert await conn.fetchval("SELECT minion_complete($1, 1, 1)", backup["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    assert await conn.fetchval(REFEREE_ROWS, task_id) == 0  # the promoted backup's own row
    await conn.close()


async def test_failed_backup_leaves_the_straggler_alone(database_url: str) -> None:
    conn, task_id, _, straggler, spare = await _straggling(database_url)
    await asyncio.sleep(0.3)
    backup = await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 4)", spare)
    assert await conn.fetchval("SELECT minion_fail($1, 'oom', true)", backup["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT state FROM subtasks WHERE task_id = $1 AND subtask_id = $2",
                               task_id, straggler["subtask_id"]) == "leased"
    assert await conn.fetchval("SELECT minion_complete($1, 1, 1)", straggler["lease_token"]) == "ok"
    assert await conn.fetchval(REFEREE_ROWS, task_id) == 0
    await conn.close()


async def test_cancel_drops_backups(database_url: str) -> None:
    conn, task_id, _, _, spare = await _straggling(database_url)
    await asyncio.sleep(0.3)
    backup = await conn.fetchrow("SELECT * FROM minion_claim($1, 60, 4)", spare)
    assert await conn.fetchval("SELECT minion_cancel_task($1)", task_id)
    assert await conn.fetchval("SELECT minion_complete($1, 1, 1)", backup["lease_token"]) == "lost"
    assert await conn.fetchval("SELECT minion_lease_count($1)", spare) == 0
    await conn.close()
