"""Small results kept in the subtask's row (sql/schema/07_results.sql): the schema holds a result
in one place only, and only bytes that match the SHA-256 and size recorded for them."""

from __future__ import annotations

import hashlib

import asyncpg
import pytest

from minions.config import ConfigError, Settings
from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token

OUTPUT = b'{"id":"r0","slept_ms":1}\n'
COMPLETE = "SELECT minion_complete($1, 1, 0.1, $2, $3, $4, $5)"


async def _lease(conn: asyncpg.Connection) -> object:
    _, token_id = await make_token(conn, "executor")
    await make_task(conn, subtasks=1)
    ex = await make_executor(conn, token_id)
    return await conn.fetchval("SELECT lease_token FROM minion_claim_batch($1, $2, 1)", ex, token_id)


async def test_kept_bytes_are_committed_with_their_hash_and_size(database_url: str) -> None:
    conn = await connect(database_url)
    token = await _lease(conn)
    sha = hashlib.sha256(OUTPUT).digest()
    assert await conn.fetchval(COMPLETE, token, None, sha, len(OUTPUT), OUTPUT) == "ok"
    row = await conn.fetchrow("SELECT state, result_key, result_data, result_sha256 FROM subtasks "
                              "WHERE lease_token = $1", token)
    assert (row["state"], row["result_key"], row["result_data"], row["result_sha256"]) == ("done", None, OUTPUT, sha)
    await conn.close()


@pytest.mark.parametrize("key, sha, size", [
    (None, hashlib.sha256(b"other bytes").digest(), len(OUTPUT)),  # bytes other than those hashed
    (None, hashlib.sha256(OUTPUT).digest(), len(OUTPUT) + 1),        # a size that is not theirs
    ("results/1/0/1-x.jsonl", hashlib.sha256(OUTPUT).digest(), len(OUTPUT)),  # in an object and the row
    (None, None, None),                                              # bytes with no hash or size
], ids=["wrong-hash", "wrong-size", "object-and-row", "unrecorded"])
async def test_the_schema_refuses_kept_bytes_that_do_not_match_their_record(
        database_url: str, key: str | None, sha: bytes | None, size: int | None) -> None:
    conn = await connect(database_url)
    token = await _lease(conn)
    with pytest.raises(asyncpg.CheckViolationError, match="subtasks_result_complete"):
        await conn.fetchval(COMPLETE, token, key, sha, size, OUTPUT)
    # Nothing was committed: the lease is still live and completes with the right record.
    assert await conn.fetchval("SELECT state FROM subtasks WHERE lease_token = $1", token) == "leased"
    assert await conn.fetchval(COMPLETE, token, None, hashlib.sha256(OUTPUT).digest(), len(OUTPUT), OUTPUT) == "ok"
    await conn.close()


async def test_a_result_with_its_bytes_in_neither_place_is_refused(database_url: str) -> None:
    """The row's "dropped after compaction" shape is never a commit: such a result would be lost."""
    conn = await connect(database_url)
    token = await _lease(conn)
    with pytest.raises(asyncpg.CheckViolationError, match="needs its bytes"):
        await conn.fetchval(COMPLETE, token, None, hashlib.sha256(OUTPUT).digest(), len(OUTPUT), None)
    assert await conn.fetchval("SELECT state FROM subtasks WHERE lease_token = $1", token) == "leased"
    await conn.close()


async def test_a_repeated_complete_with_other_bytes_changes_nothing(database_url: str) -> None:
    conn = await connect(database_url)
    token = await _lease(conn)
    sha = hashlib.sha256(OUTPUT).digest()
    assert await conn.fetchval(COMPLETE, token, None, sha, len(OUTPUT), OUTPUT) == "ok"
    other = b'{"id":"r0","slept_ms":2}\n'
    assert await conn.fetchval(COMPLETE, token, None, hashlib.sha256(other).digest(), len(other), other) == "repeat"
    assert await conn.fetchval("SELECT result_data FROM subtasks WHERE lease_token = $1", token) == OUTPUT
    await conn.close()


async def _compacted_task(conn: asyncpg.Connection, subtasks: int, age_s: float, *,
                          objects: frozenset[int] = frozenset()) -> int:
    """A completed task whose `subtasks` results are kept in rows (those whose subtask id is in
    `objects` in a result object instead), marked compacted `age_s` ago."""
    _, token_id = await make_token(conn, "executor")
    task_id = await make_task(conn, subtasks=subtasks)
    ex = await make_executor(conn, token_id)
    sha = hashlib.sha256(OUTPUT).digest()
    for row in await conn.fetch("SELECT lease_token, subtask_id FROM minion_claim_batch($1, $2, $3)",
                                ex, token_id, subtasks):
        where = (f"results/{task_id}/{row['subtask_id']}/1-x.jsonl", None) if row["subtask_id"] in objects \
            else (None, OUTPUT)
        assert await conn.fetchval(COMPLETE, row["lease_token"], where[0], sha, len(OUTPUT), where[1]) == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    await conn.execute("INSERT INTO compacted_tasks (task_id, parts, bytes, compacted_at) "
                       "VALUES ($1, 1, $2, now() - make_interval(secs => $3))", task_id, subtasks * len(OUTPUT), age_s)
    return task_id


async def _kept(conn: asyncpg.Connection, task_id: int) -> int:
    kept: int = await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND result_data IS NOT NULL",
                                    task_id)
    return kept


@pytest.mark.parametrize("subtasks", [5, 4], ids=["remainder", "exact-multiple"])
async def test_gc_drops_kept_bytes_after_the_grace_in_batches_by_subtask_id(database_url: str, subtasks: int) -> None:
    conn = await connect(database_url)
    task_id = await _compacted_task(conn, subtasks, age_s=60)
    drop = "SELECT task_id, subtasks, bytes FROM minion_gc_kept_results($1, $2, $3)"
    # Within the grace: nothing due, nothing dropped.
    assert await conn.fetch(drop, 3600.0, False, 2) == []
    # A dry run says what would go and changes nothing.
    assert [tuple(r) for r in await conn.fetch(drop, 0.0, True, 2)] == [(task_id, subtasks, subtasks * len(OUTPUT))]
    assert await _kept(conn, task_id) == subtasks
    # Batches of 2 walk the task once; the task is done after its last batch and never looked at again.
    seen = []
    while rows := await conn.fetch(drop, 0.0, False, 2):
        seen.append(rows[0]["subtasks"])
        assert len(seen) <= 3
    assert seen == ([2, 2, 1] if subtasks == 5 else [2, 2])
    assert await _kept(conn, task_id) == 0
    assert await conn.fetchval("SELECT kept_results_dropped FROM compacted_tasks WHERE task_id = $1", task_id)
    # What was committed stays on record.
    assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND result_sha256 IS NOT NULL",
                               task_id) == subtasks
    await conn.close()


async def test_gc_steps_over_results_kept_elsewhere(database_url: str) -> None:
    """A batch takes the next p_limit rows that keep bytes, however far apart: results in objects
    between them cost no call of their own, and a task with none kept is done in one call."""
    conn = await connect(database_url)
    task_id = await _compacted_task(conn, 6, age_s=60, objects=frozenset({0, 2, 4}))
    none_kept = await _compacted_task(conn, 4, age_s=30, objects=frozenset(range(4)))
    calls = [tuple(r) for r in await conn.fetch("SELECT * FROM minion_gc_kept_results(0, false, 2)")]
    while rows := await conn.fetch("SELECT * FROM minion_gc_kept_results(0, false, 2)"):
        calls.append(tuple(rows[0]))
        assert len(calls) <= 3
    assert calls == [(task_id, 2, 2 * len(OUTPUT)), (task_id, 1, len(OUTPUT)), (none_kept, 0, 0)]
    assert await _kept(conn, task_id) == 0
    assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND result_key IS NOT NULL",
                               task_id) == 3
    await conn.close()


def test_the_setting_stops_at_one_mib() -> None:
    """Rows are not the place for big results (and the check reads a kept output whole)."""
    Settings(result_in_database_bytes=1024 * 1024).validate()
    with pytest.raises(ConfigError, match="MINIONS_RESULT_IN_DATABASE_BYTES must be <= 1048576"):
        Settings(result_in_database_bytes=1024 * 1024 + 1).validate()
