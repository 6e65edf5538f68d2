"""The batched steps in SQL (sql/schema/06_leases.sql): a batched claim takes what the
same number of single claims would, in the same order, and a batched complete or fail ends its tasks
exactly once, deciding after its last close."""

from __future__ import annotations

import uuid

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token

ENDINGS = "SELECT count(*) FROM tasks WHERE id = $1 AND status = $2 AND finished_at IS NOT NULL"


async def _setup(database_url: str) -> tuple[asyncpg.Connection, int]:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor")
    return conn, token_id


async def _claim(conn: asyncpg.Connection, ex: uuid.UUID, token_id: int, most: int) -> list[asyncpg.Record]:
    rows = await conn.fetch("SELECT * FROM minion_claim_batch($1, $2, $3)", ex, token_id, most)
    return [r for r in rows if r["verdict"] == "leased"]


async def test_a_batched_claim_takes_priority_then_fifo_across_capabilities_in_claim_order(
        database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    old = await make_task(conn, subtasks=3)
    urgent = await make_task(conn, subtasks=2, priority=5)
    embed = await make_task(conn, subtasks=2, kind="embedding", model="m1", priority=1)
    ex = await make_executor(conn, token_id, kinds=("sleep", "embedding"), models=("m1",))
    won = await _claim(conn, ex, token_id, 6)
    assert [(r["task_id"], r["subtask_id"]) for r in won] == [
        (urgent, 0), (urgent, 1), (embed, 0), (embed, 1), (old, 0), (old, 1)]
    # The attempts' history shows the claim order: leased_at a microsecond apart, in that order.
    stamps = [await conn.fetchval("SELECT leased_at FROM subtasks WHERE lease_token = $1", r["lease_token"])
              for r in won]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert len({r["lease_token"] for r in won}) == 6
    assert await conn.fetchval("SELECT count(*) FROM minion_subtask_acquirement") == 6
    left = await _claim(conn, ex, token_id, 6)
    assert [(r["task_id"], r["subtask_id"]) for r in left] == [(old, 2)]
    assert [r["verdict"] for r in await conn.fetch("SELECT * FROM minion_claim_batch($1, $2, 5)", ex, token_id)] \
        == ["empty"]
    await conn.close()


async def test_a_batched_claim_fills_from_each_preference_in_order_then_the_queue(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    other = await make_task(conn, team="search", project="other", subtasks=2)
    ranker = await make_task(conn, team="search", project="ranker", name="emb-1", subtasks=2)
    exact = await make_task(conn, team="search", project="ranker", name="emb-2", subtasks=2)
    b_team = await make_task(conn, team="team-b", subtasks=2)
    ex = await make_executor(conn, token_id, preferences=[
        {"team": "search", "project": "ranker", "task_name": "emb-2"}, {"team": "search", "project": "ranker"},
        {"team": "team-b"}])
    won = await _claim(conn, ex, token_id, 7)
    assert [r["task_id"] for r in won] == [exact, exact, ranker, ranker, b_team, b_team, other]
    await conn.close()


async def test_each_lease_of_every_branch_is_its_referee_rows_and_stamped_in_claim_order(database_url: str) -> None:
    """Each branch of the claim (a task by name, a project, a team, the whole queue) writes a lease and
    its referee row with one token, for the executor that won it, stamped in claim order."""
    conn, token_id = await _setup(database_url)
    await make_task(conn, team="search", project="other", subtasks=2)
    await make_task(conn, team="search", project="ranker", name="emb-1", subtasks=2)
    await make_task(conn, team="search", project="ranker", name="emb-2", subtasks=2)
    await make_task(conn, team="team-b", subtasks=2)
    ex = await make_executor(conn, token_id, preferences=[
        {"team": "search", "project": "ranker", "task_name": "emb-2"}, {"team": "search", "project": "ranker"},
        {"team": "team-b"}])
    won = await _claim(conn, ex, token_id, 8)
    assert len(won) == 8
    referee = {r["lease_token"]: (r["task_id"], r["subtask_id"], r["executor_id"]) for r in await conn.fetch(
        "SELECT lease_token, task_id, subtask_id, executor_id FROM minion_subtask_acquirement")}
    assert referee == {r["lease_token"]: (r["task_id"], r["subtask_id"], ex) for r in won}
    leased = await conn.fetch("SELECT lease_token, lease_executor, attempts, leased_at FROM subtasks "
                              "WHERE state = 'leased' ORDER BY leased_at")
    assert [r["lease_token"] for r in leased] == [r["lease_token"] for r in won]
    assert {(r["lease_executor"], r["attempts"]) for r in leased} == {(ex, 1)}
    assert len({r["leased_at"] for r in leased}) == 8
    await conn.close()


async def test_a_team_executor_batch_claims_only_its_team(database_url: str) -> None:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor", team="team-b")
    await make_task(conn, team="team-a", subtasks=3)
    b = await make_task(conn, team="team-b", subtasks=2)
    ex = await make_executor(conn, token_id, team="team-b")
    assert [r["task_id"] for r in await _claim(conn, ex, token_id, 10)] == [b, b]
    await conn.close()


async def test_a_batched_complete_spanning_two_tasks_ends_each_once_and_stops_deferring(
        database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    first = await make_task(conn, subtasks=3)
    second = await make_task(conn, subtasks=2)
    ex = await make_executor(conn, token_id)
    won = await _claim(conn, ex, token_id, 5)
    tokens = [r["lease_token"] for r in won]
    async with conn.transaction():
        verdicts = await conn.fetch("SELECT * FROM minion_complete_batch($1, $2, $3, $4, $5, $6)", tokens[:4],
                                    [1] * 4, [0.0] * 4, [None] * 4, [None] * 4, [None] * 4)
        assert [v["verdict"] for v in verdicts] == ["ok"] * 4
        assert await conn.fetchval(ENDINGS, first, "completed") == 1
        assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", second) == "running"
        # After the batch, in the same transaction, a single close decides at once again.
        assert await conn.fetchval("SELECT minion_settle_deferred()") is False
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.0)", tokens[4]) == "ok"
        assert await conn.fetchval(ENDINGS, second, "completed") == 1
    counts = await conn.fetchrow("SELECT * FROM minion_task_counts($1)", first)
    assert (counts["subtasks_done"], counts["records_done"]) == (3, 3)
    await conn.close()


async def test_a_batched_fail_out_of_attempts_fails_the_task_once(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task_id = await make_task(conn, subtasks=2, max_attempts=1)
    ex = await make_executor(conn, token_id)
    tokens = [r["lease_token"] for r in await _claim(conn, ex, token_id, 2)]
    verdicts = await conn.fetch("SELECT * FROM minion_fail_batch($1, $2, $3)", tokens, ["boom", "bang"],
                                [True, True])
    assert [v["verdict"] for v in verdicts] == ["ok", "ok"]
    assert await conn.fetchval(ENDINGS, task_id, "failed") == 1
    assert await conn.fetchval("SELECT error FROM tasks WHERE id = $1", task_id) == \
        "subtask 0 failed after 1 attempt(s): boom"  # the first failure's reason
    await conn.close()


async def test_a_batch_of_a_many_capability_executor_hides_at_most_one_row_of_each_from_others(
        database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    await make_task(conn, subtasks=40, priority=5)
    embed = await make_task(conn, subtasks=5, kind="embedding", model="m1")
    both = await make_executor(conn, token_id, kinds=("sleep", "embedding"), models=("m1",))
    only_embedding = await make_executor(conn, token_id, kinds=("embedding",), models=("m1",))
    holder = await connect(database_url)
    try:
        async with holder.transaction():  # the many-capability claim, not yet committed
            won = await _claim(holder, both, token_id, 10)
            assert len(won) == 10 and {r["kind"] for r in won} == {"sleep"}
            # Another executor that serves only embeddings still finds them: the claim in flight
            # holds at most the head of that capability (as one-at-a-time claims always did).
            other = await _claim(conn, only_embedding, token_id, 10)
            assert [r["task_id"] for r in other] == [embed] * len(other) and len(other) >= 4
    finally:
        await holder.close()
    # A capability named twice is one capability (no row leased twice).
    ex = await make_executor(conn, token_id)
    await make_task(conn, subtasks=3)
    tokens = await conn.fetchval("SELECT minion_claim_some_in($1, '{sleep:*,sleep:*}', NULL, NULL, NULL, 5, 0)", ex)
    assert len(set(tokens)) == len(tokens) == 5
    await conn.close()


async def _claim_reading_tasks(conn: asyncpg.Connection, ex: uuid.UUID,
                               token_id: int) -> tuple[list[asyncpg.Record], int]:
    """A claim of one, and the pages of the tasks table it read (this transaction's counter)."""
    await conn.execute("ANALYZE tasks")
    read = "SELECT pg_stat_get_xact_blocks_fetched('tasks'::regclass)"
    async with conn.transaction():
        before = await conn.fetchval(read)
        won = await _claim(conn, ex, token_id, 1)
        return won, await conn.fetchval(read) - before


async def test_a_claim_preferring_a_task_by_name_reads_that_task_not_its_whole_project(database_url: str) -> None:
    """The claim runs on generic plans (sql/schema/06_leases.sql): the task preferred by name is found by its name,
    not by reading every task of its project and filtering."""
    conn, token_id = await _setup(database_url)
    await conn.execute(
        """INSERT INTO tasks (team, project, name, kind, model, priority, subtask_size, max_attempts, input_uri,
                              request_hash)
           SELECT 'search', 'ranker', 'old-' || i, 'sleep', 'sleep', 0, 1, 3, 'file:///nowhere.jsonl', 'h'
             FROM generate_series(1, 2000) AS i""")
    wanted = await make_task(conn, team="search", project="ranker", name="wanted", subtasks=2)
    ex = await make_executor(conn, token_id, preferences=[{"team": "search", "project": "ranker",
                                                           "task_name": "wanted"}])
    won, pages = await _claim_reading_tasks(conn, ex, token_id)
    assert [r["task_id"] for r in won] == [wanted]
    assert pages <= 10, pages  # with one `IS NULL OR` statement, the whole project: 54 pages
    await conn.close()


async def test_the_claim_carries_its_plan_settings(database_url: str) -> None:
    """The claim's plan settings are the function's own (generic plans, no sequential scans): a
    definition of minion_claim_batch without them would silently bring back a planning of every
    claim, or scans of the whole subtasks table."""
    conn = await connect(database_url)
    config = await conn.fetchval("SELECT proconfig FROM pg_proc WHERE oid = $1::regprocedure",
                                 "minion_claim_batch(uuid, bigint, integer, double precision)")
    assert sorted(config) == ["enable_seqscan=off", "plan_cache_mode=force_generic_plan"]
    await conn.close()


async def test_a_claim_planned_on_small_tables_scans_none_of_them_later(database_url: str) -> None:
    """sql/schema/06_leases.sql: the claim's cached plans, made while the tables were one page, still read subtasks,
    tasks and the referee table by index once they hold more (no sequential scan in the claim's own
    transaction's statistics)."""
    conn, token_id = await _setup(database_url)
    ex = await make_executor(conn, token_id)
    scans = """SELECT coalesce(sum(seq_scan), 0) FROM pg_stat_xact_user_tables
                WHERE relname IN ('subtasks', 'tasks', 'minion_subtask_acquirement')"""
    for rounds in (3, 200):  # the first claims plan on one page; then the tables grow under the plans
        for _ in range(rounds):
            await make_task(conn, subtasks=2)
        for most in (1, 10):
            async with conn.transaction():
                won = await _claim(conn, ex, token_id, most)
                assert won and await conn.fetchval(scans) == 0, most
            for r in won:
                assert await conn.fetchval("SELECT minion_complete($1, $2, 0.0)", r["lease_token"], r["records"]) \
                    == "ok"
    await conn.close()


async def test_a_claim_preferring_a_project_reads_its_open_tasks_not_its_history(database_url: str) -> None:
    """A project's finished tasks stay until retention removes them (30 days by default): a claim
    preferring the project looks up its open tasks only (sql/schema/06_leases.sql)."""
    conn, token_id = await _setup(database_url)
    await conn.execute(
        """INSERT INTO tasks (team, project, name, kind, model, priority, subtask_size, max_attempts, input_uri,
                              request_hash, split_done, status, finished_at)
           SELECT 'search', 'ranker', 'done-' || i, 'sleep', 'sleep', 0, 1, 3, 'file:///nowhere.jsonl', 'h',
                  true, 'completed', now()
             FROM generate_series(1, 5000) AS i""")
    open_task = await make_task(conn, team="search", project="ranker", subtasks=2)
    ex = await make_executor(conn, token_id, preferences=[{"team": "search", "project": "ranker"}])
    won, pages = await _claim_reading_tasks(conn, ex, token_id)
    assert [r["task_id"] for r in won] == [open_task]
    # The rest of the claim reads a dozen pages of tasks, whatever the project's history (12-19 pages
    # with 200 to 8,000 finished tasks); reading the history read them all (5,000 rows here).
    assert pages <= 30, pages
    await conn.close()


async def test_a_claim_starts_each_task_it_takes_from_once_and_leaves_a_running_one_be(database_url: str) -> None:
    """sql/schema/06_leases.sql: only tasks still 'splitting' or 'queued' are updated to 'running', in the claim that
    takes their first subtask; a later claim leaves the row (and its started_at) as it is."""
    conn, token_id = await _setup(database_url)
    queued = await make_task(conn, subtasks=3)
    splitting = await conn.fetchval(
        "INSERT INTO tasks (team, project, name, kind, model, subtask_size, max_attempts, input_uri, request_hash) "
        "VALUES ('search', 'ranker', 'splitting', 'sleep', 'sleep', 1, 3, 'file:///x.jsonl', 'h') RETURNING id")
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", splitting)
    assert await conn.fetchval("SELECT minion_add_subtasks($1, '{0,100}', '{100,200}', '{0,1}', '{1,1}', 0, 200, 2)",
                               splitting)
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", splitting) == "splitting"
    ex = await make_executor(conn, token_id)
    won = await _claim(conn, ex, token_id, 3)
    assert [(r["task_id"], r["subtask_id"]) for r in won] == [(queued, 0), (queued, 1), (queued, 2)]
    won = await _claim(conn, ex, token_id, 1)
    assert [(r["task_id"], r["subtask_id"]) for r in won] == [(splitting, 0)]
    started = {r["id"]: (r["status"], r["started_at"]) for r in
               await conn.fetch("SELECT id, status, started_at FROM tasks WHERE id = ANY ($1)", [queued, splitting])}
    assert {status for status, at in started.values() if at is not None} == {"running"} and len(started) == 2
    # A later claim of the running task takes its subtask and leaves the task's row alone: it runs no
    # UPDATE of tasks at all (one that matches no row changes no xmin; a statement trigger still counts
    # it, as it counted the no-op UPDATE every claim ran before sql/schema/06_leases.sql).
    await conn.execute("""
        CREATE FUNCTION test_count_task_updates() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM set_config('minions_test.task_updates',
                               (coalesce(nullif(current_setting('minions_test.task_updates', true), ''), '0')::int
                                + 1)::text, false);
            RETURN NULL;
        END $$;
        CREATE TRIGGER test_count_task_updates AFTER UPDATE ON tasks
            FOR EACH STATEMENT EXECUTE FUNCTION test_count_task_updates();
        SELECT set_config('minions_test.task_updates', '0', false);""")
    before = await conn.fetchval("SELECT xmin::text FROM tasks WHERE id = $1", splitting)
    won = await _claim(conn, ex, token_id, 5)
    assert [(r["task_id"], r["subtask_id"]) for r in won] == [(splitting, 1)]
    assert won[0]["kind"] == "sleep" and won[0]["input_uri"] == "file:///x.jsonl" and won[0]["records"] == 1
    assert await conn.fetchval("SELECT xmin::text FROM tasks WHERE id = $1", splitting) == before
    assert await conn.fetchval("SELECT current_setting('minions_test.task_updates')") == "0"
    assert await conn.fetchval("SELECT started_at FROM tasks WHERE id = $1", splitting) == started[splitting][1]
    await conn.close()
