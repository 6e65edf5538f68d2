"""The lease functions in SQL, called as an operator would from psql."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from minions.db.connect import connect, create_pool
from minions.testing.factories import make_executor, make_task, make_token, silence


async def _setup(database_url: str) -> tuple[asyncpg.Connection, int]:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor")
    return conn, token_id


async def test_concurrent_claims_lease_each_subtask_exactly_once(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=100)
    executors = [await make_executor(conn, token_id) for _ in range(50)]
    pool = await create_pool(database_url, min_size=10, max_size=50)
    won: list[tuple[int, int]] = []

    async def claimer(executor_id: uuid.UUID) -> None:
        while True:
            row = await pool.fetchrow("SELECT * FROM minion_claim($1, 60)", executor_id)
            if row is None:
                return
            won.append((row["task_id"], row["subtask_id"]))

    await asyncio.gather(*(claimer(e) for e in executors))
    assert sorted(won) == [(task_id, i) for i in range(100)]
    assert await conn.fetchval("SELECT count(*) FROM minion_subtask_acquirement") == 100
    await pool.close()
    await conn.close()


async def test_a_complete_reads_its_referee_row_not_every_lease_since_the_last_vacuum(database_url: str) -> None:
    """Every claim inserts a referee row and every complete deletes one, so between two vacuums the
    table grows by a page every few dozen leases while it holds one live row per lease. A complete
    deleted its row by a sequential scan of all those pages, on the plan its connection cached while
    the table was one page; sql/schema/06_leases.sql deletes it through the token's index, whatever the cached plan."""
    COMPLETE = "SELECT minion_complete($1, $2, 0.1)"
    conn, token_id = await _setup(database_url)
    await conn.execute("ALTER TABLE minion_subtask_acquirement SET (autovacuum_enabled = false)")
    executor = await make_executor(conn, token_id)
    await make_task(conn, subtasks=2001)
    for _ in range(2000):  # one connection, as an API pool's: its plans cached on the first calls
        lease = await conn.fetchrow("SELECT lease_token, records FROM minion_claim($1, 60)", executor)
        assert await conn.fetchval(COMPLETE, lease["lease_token"], lease["records"]) == "ok"
    grown = await conn.fetchval("SELECT pg_relation_size('minion_subtask_acquirement') / 8192")
    assert grown >= 5, grown  # the dead rows' pages, which a scan would read
    lease = await conn.fetchrow("SELECT lease_token, records FROM minion_claim($1, 60)", executor)
    pages = "SELECT pg_stat_get_xact_blocks_fetched('minion_subtask_acquirement'::regclass)"
    async with conn.transaction():
        before = await conn.fetchval(pages)
        assert await conn.fetchval(COMPLETE, lease["lease_token"], lease["records"]) == "ok"
        read = await conn.fetchval(pages) - before
    assert read <= 2, (read, grown)  # the row's page (its index is another relation)
    assert await conn.fetchval("SELECT count(*) FROM minion_subtask_acquirement") == 0
    await conn.close()


async def test_claim_order_priority_then_fifo_and_capabilities(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    old = await make_task(conn, subtasks=2)
    urgent = await make_task(conn, subtasks=2, priority=5)
    await make_task(conn, subtasks=2, kind="embedding", model="m1")
    ex = await make_executor(conn, token_id)
    order = [(await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex))["task_id"] for _ in range(4)]
    assert order == [urgent, urgent, old, old]
    # Only what it advertised: the embedding task is never handed to a sleep-only executor.
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex) is None
    await conn.close()


async def test_preferences_first_then_fallback(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    a = await make_task(conn, team="team-a", subtasks=1)
    b = await make_task(conn, team="team-b", subtasks=1)
    ex = await make_executor(conn, token_id, preferences=[{"team": "team-b"}])
    first = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    second = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    assert (first["task_id"], second["task_id"]) == (b, a)
    await conn.close()


async def test_team_scoped_executor_claims_only_its_team(database_url: str) -> None:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor", team="team-b")
    await make_task(conn, team="team-a", subtasks=1)
    b = await make_task(conn, team="team-b", subtasks=1)
    ex = await make_executor(conn, token_id, team="team-b")
    assert (await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex))["task_id"] == b
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex) is None
    await conn.close()


async def test_stale_token_cannot_complete(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=1)
    slow, fast = await make_executor(conn, token_id), await make_executor(conn, token_id)
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", slow)
    assert await conn.fetchval("SELECT minion_release($1)", lease["lease_token"]) == "ok"
    second = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", fast)
    assert second["attempt"] == 1  # a release does not count as an attempt
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", lease["lease_token"]) == "lost"
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", second["lease_token"]) == "ok"
    # A retried complete of the committed lease (its first answer lost on the wire) is answered the
    # same by the API ('repeat': 200 again), and commits nothing twice.
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", second["lease_token"]) == "repeat"
    assert await conn.fetchval("SELECT count(*) FROM subtask_attempts WHERE outcome = 'done'") == 1
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", lease["lease_token"]) == "lost"
    task = await conn.fetchrow("SELECT status, finished_at FROM tasks WHERE id = $1", task_id)
    assert task["status"] == "completed" and task["finished_at"] is not None
    await conn.close()


async def test_retryable_failures_until_max_attempts(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=1, max_attempts=2)
    ex = await make_executor(conn, token_id)
    for attempt, error in ((1, "first boom"), (2, "second boom")):
        lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
        assert lease["attempt"] == attempt
        assert await conn.fetchval("SELECT minion_fail($1, $2, true)", lease["lease_token"], error) == "ok"
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex) is None
    sub = await conn.fetchrow("SELECT state, last_error FROM subtasks WHERE task_id = $1", task_id)
    assert (sub["state"], sub["last_error"]) == ("failed", "second boom")
    task = await conn.fetchrow("SELECT status, error FROM tasks WHERE id = $1", task_id)
    assert task["status"] == "failed" and "second boom" in task["error"]
    history = await conn.fetch(
        "SELECT outcome, error FROM subtask_attempts WHERE task_id = $1 ORDER BY attempt", task_id)
    assert [(h["outcome"], h["error"]) for h in history] == [("failed", "first boom"), ("failed", "second boom")]
    await conn.close()


async def test_non_retryable_failure_fails_at_once(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=2, max_attempts=3)
    ex = await make_executor(conn, token_id)
    first = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    assert await conn.fetchval("SELECT minion_fail($1, 'unknown model', false)", first["lease_token"]) == "ok"
    second = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    assert second["subtask_id"] != first["subtask_id"]
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", second["lease_token"]) == "ok"
    task = await conn.fetchrow("SELECT status, open_subtasks FROM tasks WHERE id = $1", task_id)
    assert (task["status"], task["open_subtasks"]) == ("failed", 0)
    await conn.close()


async def test_reclaim_silent_executor(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=1)
    silent, other = await make_executor(conn, token_id), await make_executor(conn, token_id)
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", silent)
    assert await conn.fetchval("SELECT minion_reclaim_executor($1, 60)", silent) == 0  # not silent yet
    await silence(conn, silent, 120)
    assert await conn.fetchval("SELECT minion_reclaim_expired(60)") == 1
    assert await conn.fetchval("SELECT status FROM executors WHERE id = $1", silent) == "lost"
    again = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", other)
    assert again["attempt"] == 2 and again["task_id"] == task_id
    beat = await conn.fetch("SELECT * FROM minion_heartbeat($1, $2)", silent, [lease["lease_token"]])
    assert beat[0]["state"] == "lost"
    await conn.close()


async def test_cancel_answers_cancelled_to_holders(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=3)
    ex = await make_executor(conn, token_id)
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    assert await conn.fetchval("SELECT minion_cancel_task($1)", task_id)
    beat = await conn.fetch("SELECT * FROM minion_heartbeat($1, $2)", ex, [lease["lease_token"]])
    assert beat[0]["state"] == "cancelled"
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", lease["lease_token"]) == "cancelled"
    states = await conn.fetch("SELECT DISTINCT state FROM subtasks WHERE task_id = $1", task_id)
    assert [s["state"] for s in states] == ["cancelled"]
    assert await conn.fetchval("SELECT minion_lease_count($1)", ex) == 0
    await conn.close()


async def test_claim_uses_the_pending_index(database_url: str) -> None:
    conn, _ = await _setup(database_url)
    for _ in range(3):
        await make_task(conn, subtasks=2000)
    await conn.execute("ANALYZE subtasks")
    plan = await conn.fetchval(
        """EXPLAIN (FORMAT JSON) SELECT s.capability, s.priority, s.task_id FROM subtasks s
           WHERE s.state = 'pending' AND s.capability = 'sleep:*'
           ORDER BY s.priority DESC, s.task_id, s.subtask_id LIMIT 1"""
    )
    assert "subtasks_pending_queue" in str(plan)
    await conn.close()


async def test_project_and_task_preferences(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    other = await make_task(conn, team="search", project="other", subtasks=1)
    ranker = await make_task(conn, team="search", project="ranker", name="emb-1", subtasks=1)
    exact = await make_task(conn, team="search", project="ranker", name="emb-2", subtasks=1)
    ex = await make_executor(conn, token_id, preferences=[
        {"team": "search", "project": "ranker", "task_name": "emb-2"}, {"team": "search", "project": "ranker"}])
    order = [(await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex))["task_id"] for _ in range(3)]
    assert order == [exact, ranker, other]
    await conn.close()


async def test_registering_again_ends_the_leases_of_the_previous_process(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=1)
    ex = await make_executor(conn, token_id, name="anna-mbp")
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    # The agent restarts under the same name: its old lease is gone with the old process.
    assert await make_executor(conn, token_id, name="anna-mbp") == ex
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", lease["lease_token"]) == "lost"
    again = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    assert (again["task_id"], again["attempt"]) == (task_id, 2)
    outcome = await conn.fetchval("SELECT outcome FROM subtask_attempts WHERE task_id = $1", task_id)
    assert outcome == "lost"
    await conn.close()


async def test_cancel_racing_completes_and_fails_never_deadlocks(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    pool = await create_pool(database_url, min_size=9, max_size=9)
    executors = [await make_executor(conn, token_id) for _ in range(8)]
    for _ in range(8):
        task_id = await make_task(conn, subtasks=40)
        leases = [await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", e) for e in executors]

        async def finish(i: int, lease: asyncpg.Record) -> None:
            sql = "SELECT minion_complete($1, 1, 0.1)" if i % 2 else "SELECT minion_fail($1, 'x', true)"
            await pool.fetchval(sql, lease["lease_token"])

        await asyncio.gather(*(finish(i, lease) for i, lease in enumerate(leases)),
                             pool.fetchval("SELECT minion_cancel_task($1)", task_id))
        assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "cancelled"
    await pool.close()
    await conn.close()


async def test_a_heartbeat_that_leaves_a_lease_out_ends_it_after_the_grace(database_url: str) -> None:
    """A claim whose answer was lost: the executor heartbeats on without naming that lease."""
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=2)
    ex = await make_executor(conn, token_id)
    forgotten = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    known = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", ex)
    # Within the grace a fresh lease may not have reached the executor yet: nothing happens.
    await conn.fetch("SELECT * FROM minion_heartbeat($1, $2, 60)", ex, [known["lease_token"]])
    assert await conn.fetchval("SELECT minion_lease_count($1)", ex) == 2
    await conn.execute("UPDATE subtasks SET leased_at = now() - interval '2 minutes' WHERE task_id = $1", task_id)
    beats = await conn.fetch("SELECT * FROM minion_heartbeat($1, $2, 60)", ex, [known["lease_token"]])
    assert [(b["lease_token"], b["state"]) for b in beats] == [(known["lease_token"], "ok")]
    sub = await conn.fetchrow("SELECT state, attempts FROM subtasks WHERE task_id = $1 AND subtask_id = $2",
                              task_id, forgotten["subtask_id"])
    assert sub["state"] == "pending"
    assert await conn.fetchval("SELECT outcome FROM subtask_attempts WHERE lease_token = $1",
                               forgotten["lease_token"]) == "lost"
    await conn.close()


RECOUNT = """SELECT count(*) AS total, count(*) FILTER (WHERE state = 'pending') AS pending,
                    count(*) FILTER (WHERE state = 'leased') AS leased, count(*) FILTER (WHERE state = 'done') AS done,
                    count(*) FILTER (WHERE state = 'failed') AS failed,
                    count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
                    coalesce(sum(records) FILTER (WHERE state = 'done'), 0) AS records_done
               FROM subtasks WHERE task_id = $1"""
COUNTS = """SELECT t.subtasks_total AS total, c.subtasks_pending AS pending, c.subtasks_leased AS leased,
                   c.subtasks_done AS done, c.subtasks_failed AS failed, c.subtasks_cancelled AS cancelled,
                   c.records_done
              FROM tasks t CROSS JOIN LATERAL minion_task_counts(t.id) c WHERE t.id = $1"""


async def test_progress_counters_agree_with_a_recount_through_every_transition(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=12, records_per_subtask=3, max_attempts=2)
    a, b = await make_executor(conn, token_id), await make_executor(conn, token_id)

    async def agree() -> None:
        assert dict(await conn.fetchrow(COUNTS, task_id)) == dict(await conn.fetchrow(RECOUNT, task_id))

    await agree()
    leases = [await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", e) for e in (a, b, a, b, a, b)]
    await agree()
    await conn.fetchval("SELECT minion_complete($1, 3, 0.1)", leases[0]["lease_token"])
    await conn.fetchval("SELECT minion_fail($1, 'x', false)", leases[1]["lease_token"])
    await conn.fetchval("SELECT minion_fail($1, 'x', true)", leases[2]["lease_token"])
    await conn.fetchval("SELECT minion_release($1)", leases[3]["lease_token"])
    await agree()
    await silence(conn, b, 300)
    await conn.fetchval("SELECT minion_reclaim_executor($1, 60)", b)
    await agree()
    await conn.fetchval("SELECT minion_cancel_task($1)", task_id)
    await agree()
    await conn.close()


async def test_the_output_key_keeps_its_layout_and_is_folded_into_the_statement(database_url: str) -> None:
    """minion_output_key: the key's layout is kept, from an expression the planner inlines (no call
    of the SQL-function executor per lease)."""
    conn = await connect(database_url)
    for task_id, subtask_id, attempt in ((1, 0, 1), (9_007_199_254_740_993, 2_147_483_647, 12)):
        token = uuid.uuid4()
        assert await conn.fetchval("SELECT minion_output_key($1, $2, $3, $4)", task_id, subtask_id, attempt, token) \
            == f"outputs/{task_id}/{subtask_id}/{attempt}-{token}.jsonl" \
            == await conn.fetchval("SELECT format('outputs/%s/%s/%s-%s.jsonl', $1::bigint, $2::integer, $3::integer, "
                                   "$4::uuid)", task_id, subtask_id, attempt, token)
    plan = "\n".join(r[0] for r in await conn.fetch(
        "EXPLAIN (VERBOSE, COSTS OFF) SELECT minion_output_key(s.task_id, s.subtask_id, s.attempts, s.lease_token) "
        "FROM subtasks s"))
    assert "minion_output_key" not in plan and "'outputs/'::text" in plan, plan
    await conn.close()
