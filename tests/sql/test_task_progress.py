"""Task progress without a hot task row (sql/schema/04_tasks.sql): completes of one task run
side by side, and the task still ends exactly once, when its last subtask closes."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from minions.db.connect import connect, create_pool
from minions.testing.factories import make_executor, make_task, make_token
from tests.support.settling import task_left_to_the_splitter

ENDINGS = "SELECT count(*) FROM tasks WHERE id = $1 AND status = 'completed' AND finished_at IS NOT NULL"


async def _settle_sweep(conn: asyncpg.Connection) -> None:
    """What the splitter's sweep runs (services/splitter/worker.py) when a tail close NOTIFYs."""
    for row in await conn.fetch("SELECT minion_settle_candidates(100) AS id"):
        await conn.fetchval("SELECT minion_settle_waiting($1)", row["id"])


async def test_racing_last_completes_end_the_task_once_with_every_count(database_url: str) -> None:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor")
    executors = [await make_executor(conn, token_id) for _ in range(16)]
    pool = await create_pool(database_url, min_size=16, max_size=16)
    for _ in range(5):
        task_id = await make_task(conn, subtasks=16, records_per_subtask=2)
        leases = [await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", e) for e in executors]
        answers = await asyncio.gather(*(pool.fetchval("SELECT minion_complete($1, 2, 0.1)", lease["lease_token"])
                                         for lease in leases))
        assert set(answers) == {"ok"}
        # The closes either ended the task themselves or left it to the splitter's sweep.
        await _settle_sweep(conn)
        assert await conn.fetchval(ENDINGS, task_id) == 1
        counts = await conn.fetchrow("SELECT * FROM minion_task_counts($1)", task_id)
        assert (counts["subtasks_done"], counts["records_done"], counts["subtasks_pending"]) == (16, 32, 0)
        row = await conn.fetchrow("SELECT open_subtasks, records_done FROM tasks WHERE id = $1", task_id)
        assert (row["open_subtasks"], row["records_done"]) == (0, 32)  # folded in at the end
        assert await conn.fetchval("SELECT count(*) FROM task_progress_slots WHERE task_id = $1", task_id) == 0
    await pool.close()
    await conn.close()


async def _one_executor(database_url: str, subtasks: int) -> tuple[asyncpg.Connection, uuid.UUID, int]:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor")
    return conn, await make_executor(conn, token_id), await make_task(conn, subtasks=subtasks)


async def test_a_sequential_last_complete_ends_the_task_itself(database_url: str) -> None:
    conn, ex, task_id = await _one_executor(database_url, 3)
    for _ in range(3):
        lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
        assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "running"
        await conn.fetchval("SELECT minion_complete($1, $2, 0.1)", lease["lease_token"], lease["records"])
    assert await conn.fetchval(ENDINGS, task_id) == 1
    await conn.close()


async def test_a_task_with_work_left_is_never_settled_by_the_sweep(database_url: str) -> None:
    conn, ex, task_id = await _one_executor(database_url, 2)
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    await conn.fetchval("SELECT minion_complete($1, $2, 0.1)", lease["lease_token"], lease["records"])
    await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)  # leased, running long
    await _settle_sweep(conn)
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "running"
    await conn.close()


async def test_the_candidates_among_named_tasks_are_those_that_may_have_ended(database_url: str) -> None:
    conn = await connect(database_url)
    ex = await make_executor(conn, (await make_token(conn, "executor"))[1])
    ended = await task_left_to_the_splitter(conn, ex)
    other = await task_left_to_the_splitter(conn, ex)
    busy = await make_task(conn, subtasks=2)  # subtasks pending: not a candidate
    named = [busy, ended, 10**12]  # and one that does not exist
    assert [r["id"] for r in await conn.fetch("SELECT minion_settle_candidates_among($1) AS id", named)] == [ended]
    # The sweep sees both that may have ended, named or not; the named one settles like any.
    assert [r["id"] for r in await conn.fetch("SELECT minion_settle_candidates(100) AS id")] == [ended, other]
    assert await conn.fetchval("SELECT minion_settle_waiting($1)", ended)
    assert await conn.fetchval("SELECT minion_settle_candidates_among($1)", [ended]) is None
    await conn.close()


async def test_a_close_reads_the_queue_from_its_tail_not_past_the_subtasks_already_claimed(database_url: str) -> None:
    """Every close asks whether its task still has a pending subtask (sql/schema/04_tasks.sql). Read from the head of
    the task's queue, that probe walked one dead index entry per subtask claimed since the last vacuum;
    from the tail it finds a live one at once. Counted in index pages this transaction read."""
    conn, ex, task_id = await _one_executor(database_url, 3010)
    await conn.execute("ALTER TABLE subtasks SET (autovacuum_enabled = false)")  # the dead entries stay
    token_id = await conn.fetchval("SELECT token_id FROM executors WHERE id = $1", ex)
    leases = await conn.fetch("SELECT lease_token, records FROM minion_claim_batch($1, $2, 3000)", ex, token_id)
    assert len(leases) == 3000
    verdicts = await conn.fetch(
        "SELECT minion_complete(l.tok, l.n, 0.1) AS v FROM unnest($1::uuid[], $2::int[]) AS l(tok, n)",
        [r["lease_token"] for r in leases], [r["records"] for r in leases])
    assert {r["v"] for r in verdicts} == {"ok"}
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)

    pages = "SELECT pg_stat_get_xact_blocks_fetched('subtasks_pending_queue'::regclass)"
    async with conn.transaction():
        before = await conn.fetchval(pages)
        verdict = await conn.fetchval("SELECT minion_complete($1, $2, 0.1)", lease["lease_token"], lease["records"])
        read = await conn.fetchval(pages) - before
    assert verdict == "ok"
    # The root and one leaf; from the head, the ~3,000 dead entries alone fill more than ten leaves.
    assert 1 <= read <= 3, read  # the probe still reads the queue index, only not past the dead head
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "running"  # 9 still pending
    await conn.close()
