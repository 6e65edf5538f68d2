"""An embedding task's vectors have one length (sql/schema/07_results.sql): the first complete
that commits vectors fixes it on the task's row; any later complete with another length is refused
with nothing changed, its lease still live; two concurrent first completes cannot fix two."""

from __future__ import annotations

import asyncio
import hashlib

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token

MODEL = "test/embedder"
COMPLETE = "SELECT minion_complete($1, 1, 0.1, NULL, $2, $3, $4, $5)"


def _kept(dimension: int) -> tuple[bytes, int, bytes]:
    data = b'{"id":"r","embedding":[' + b",".join([b"0.5"] * dimension) + b"]}\n"
    return hashlib.sha256(data).digest(), len(data), data


async def _leases(conn: asyncpg.Connection, subtasks: int) -> tuple[int, list[object]]:
    _, token_id = await make_token(conn, "executor")
    task_id = await make_task(conn, kind="embedding", model=MODEL, subtasks=subtasks)
    ex = await make_executor(conn, token_id, kinds=("embedding",), models=(MODEL,))
    rows = await conn.fetch("SELECT lease_token FROM minion_claim_batch($1, $2, $3)", ex, token_id, subtasks)
    assert len(rows) == subtasks
    return task_id, [r["lease_token"] for r in rows]


async def test_the_first_committed_vectors_fix_the_task_s_dimension(database_url: str) -> None:
    conn = await connect(database_url)
    task_id, (first, second, third) = await _leases(conn, 3)
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) is None
    assert await conn.fetchval(COMPLETE, first, *_kept(4), 4) == "ok"
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) == 4
    # Another length: refused, nothing changed, the lease still live; the right one commits.
    assert await conn.fetchval(COMPLETE, second, *_kept(5), 5) == "dimension_mismatch"
    assert await conn.fetchval("SELECT state FROM subtasks WHERE lease_token = $1", second) == "leased"
    assert await conn.fetchval(COMPLETE, second, *_kept(4), 4) == "ok"
    # Batched: per lease, the others of the batch commit.
    rows = await conn.fetch("SELECT * FROM minion_complete_batch($1, $2, $3, $4, $5, $6, $7, $8)",
                            [third], [1], [0.1], [None], [_kept(3)[0]], [_kept(3)[1]], [_kept(3)[2]], [3])
    assert [r["verdict"] for r in rows] == ["dimension_mismatch"]
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) == 4
    await conn.close()


async def test_a_lost_lease_fixes_nothing(database_url: str) -> None:
    conn = await connect(database_url)
    task_id, (first, _) = await _leases(conn, 2)
    assert await conn.fetchval("SELECT minion_release($1)", first) == "ok"
    assert await conn.fetchval(COMPLETE, first, *_kept(7), 7) == "lost"
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) is None
    await conn.close()


async def test_two_concurrent_first_completes_cannot_fix_two_dimensions(database_url: str) -> None:
    a, b = await connect(database_url), await connect(database_url)
    task_id, (first, second) = await _leases(a, 2)
    async with a.transaction():
        assert await a.fetchval(COMPLETE, first, *_kept(4), 4) == "ok"  # fixed, not yet committed
        other = asyncio.create_task(b.fetchval(COMPLETE, second, *_kept(5), 5))
        await asyncio.sleep(0.3)
        assert not other.done()  # waits for the first's commit, then sees its length
    assert await asyncio.wait_for(other, 10) == "dimension_mismatch"
    assert await a.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) == 4
    assert await a.fetchval("SELECT state FROM subtasks WHERE lease_token = $1", second) == "leased"
    await a.close()
    await b.close()
