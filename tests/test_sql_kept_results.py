"""Small results kept in the subtask's row (sql/230_results_in_database.sql): the schema holds a result
in one place only, and only bytes that match the SHA-256 and size recorded for them."""

from __future__ import annotations

import hashlib

import asyncpg
import pytest

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
