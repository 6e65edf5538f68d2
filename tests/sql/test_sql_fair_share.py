"""Fair share between teams in SQL (sql/schema/15_fair_share.sql, the claim in 06_leases.sql): the
negotiation writes whose turn it is, claims follow the turns by weight, a team alone is served as
before, preferences come first, a lease cap holds under concurrent claims, usage is folded from the
attempts, and a task that waits while its executors serve others is noted as starving."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import Counter

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token

CYCLE = "SELECT minion_fair_share_cycle($1, $2, $3)"
HOUR = 3600.0


async def _setup(database_url: str) -> tuple[asyncpg.Connection, int]:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor")
    return conn, token_id


async def _claim(conn: asyncpg.Connection, ex: uuid.UUID, token_id: int, most: int = 1) -> list[asyncpg.Record]:
    rows = await conn.fetch("SELECT * FROM minion_claim_batch($1, $2, $3)", ex, token_id, most)
    return [r for r in rows if r["verdict"] == "leased"]


async def _teams_of(conn: asyncpg.Connection, ex: uuid.UUID, token_id: int, claims: int) -> Counter[str]:
    won: Counter[str] = Counter()
    for _ in range(claims):
        for r in await _claim(conn, ex, token_id):
            won[r["team"]] += 1
            assert await conn.fetchval("SELECT minion_complete($1, 1, 0.02)", r["lease_token"]) == "ok"
    return won


async def test_two_teams_pending_share_the_claims_equally_in_alternate_turns(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    await make_task(conn, team="team-a", subtasks=100)
    await make_task(conn, team="team-b", subtasks=30)
    ex = await make_executor(conn, token_id)
    assert await conn.fetchval(CYCLE, HOUR, 60, 300.0) == 1
    turns = [r["team"] for r in await conn.fetch(
        "SELECT team FROM fair_share_turns WHERE capability = 'sleep:*' ORDER BY turn")]
    assert len(turns) == 60 and Counter(turns) == {"team-a": 30, "team-b": 30}
    assert all(a != b for a, b in itertools.pairwise(turns))  # spread: never twice in a row
    # FIFO alone would give team-a (submitted first) all 40.
    assert await _teams_of(conn, ex, token_id, 40) == {"team-a": 20, "team-b": 20}
    await conn.close()


async def test_weights_three_to_one_give_three_quarters_of_the_claims(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    await make_task(conn, team="team-a", subtasks=100)
    await make_task(conn, team="team-b", subtasks=100)
    assert await conn.fetchrow("SELECT * FROM minion_set_team_share('team-a', 3, NULL, NULL)") is not None
    ex = await make_executor(conn, token_id)
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    won = await _teams_of(conn, ex, token_id, 60)
    assert won == {"team-a": 45, "team-b": 15}
    await conn.close()


async def test_a_team_alone_gets_every_claim_and_no_turns_are_written(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    first = await make_task(conn, team="team-a", subtasks=5, priority=0)
    urgent = await make_task(conn, team="team-a", subtasks=2, priority=5)
    ex = await make_executor(conn, token_id)
    assert await conn.fetchval(CYCLE, HOUR, 60, 300.0) == 0
    assert await conn.fetchval("SELECT count(*) FROM fair_share_turns") == 0
    won = await _claim(conn, ex, token_id, 4)
    assert [(r["task_id"], r["subtask_id"]) for r in won] == [(urgent, 0), (urgent, 1), (first, 0), (first, 1)]
    await conn.close()


async def test_preferences_come_before_the_turns(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    await make_task(conn, team="team-a", subtasks=20)
    await make_task(conn, team="team-b", subtasks=20)
    ex = await make_executor(conn, token_id, preferences=[{"team": "team-a"}])
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    assert await _teams_of(conn, ex, token_id, 10) == {"team-a": 10}
    await conn.close()


async def test_the_team_with_the_least_weighted_usage_takes_the_first_turn(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    await make_task(conn, team="team-a", subtasks=10)
    await make_task(conn, team="team-b", subtasks=10)
    ex = await make_executor(conn, token_id)
    # team-a used 10 s of compute in attempts that ended a minute ago (folded by the next negotiation).
    for r in await _claim(conn, ex, token_id, 2):
        assert await conn.fetchval("SELECT minion_complete($1, 1, 5.0)", r["lease_token"]) == "ok"
    await conn.execute("UPDATE subtask_attempts SET ended_at = now() - interval '1 minute'")
    await conn.execute("UPDATE fair_share_state SET folded_to = now() - interval '1 hour'")
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    usage = await conn.fetchval("SELECT usage FROM team_usage WHERE team = 'team-a'")
    assert abs(usage - 10 * 0.5 ** (60 / 3600)) < 0.01  # a minute's decay of a one-hour half-life
    assert await conn.fetchval("SELECT team FROM fair_share_turns WHERE turn = 0") == "team-b"
    # The next negotiation folds nothing twice: the usage only decays.
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    assert await conn.fetchval("SELECT usage FROM team_usage WHERE team = 'team-a'") <= usage
    await conn.close()


async def test_a_lease_cap_holds_against_concurrent_claims_and_others_fill_the_rest(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    await make_task(conn, team="team-a", subtasks=50)
    await make_task(conn, team="team-b", subtasks=50)
    assert await conn.fetchrow("SELECT * FROM minion_set_team_share('team-a', NULL, NULL, 3)") is not None
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    executors = [await make_executor(conn, token_id) for _ in range(4)]
    conns = [await connect(database_url) for _ in executors]

    async def claim(c: asyncpg.Connection, ex: uuid.UUID) -> list[asyncpg.Record]:
        return await _claim(c, ex, token_id, 5)

    results = await asyncio.gather(*(claim(c, ex) for c, ex in zip(conns, executors, strict=True)))
    teams = Counter(r["team"] for rows in results for r in rows)
    assert teams["team-a"] == 3 and teams["team-b"] == 17
    # At its cap: no more of team-a, even from the whole queue, until a lease ends.
    more = await _claim(conn, executors[0], token_id, 5)
    assert {r["team"] for r in more} == {"team-b"}
    held = [r for rows in results for r in rows if r["team"] == "team-a"]
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", held[0]["lease_token"]) == "ok"
    assert [r["team"] for r in await _claim(conn, executors[1], token_id, 5)].count("team-a") == 1
    for c in conns:
        await c.close()
    await conn.close()


async def test_a_capped_team_alone_in_the_queue_still_holds_its_cap(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    await make_task(conn, team="team-a", subtasks=20)
    await conn.fetchrow("SELECT * FROM minion_set_team_share('team-a', NULL, NULL, 2)")
    ex = await make_executor(conn, token_id)
    # Before any negotiation (no turns yet), the whole queue already leaves a capped team out.
    assert len(await _claim(conn, ex, token_id, 10)) == 0
    assert await conn.fetchval(CYCLE, HOUR, 60, 300.0) == 1
    assert len(await _claim(conn, ex, token_id, 10)) == 2
    assert len(await _claim(conn, ex, token_id, 10)) == 0
    await conn.close()


async def test_a_task_waiting_while_its_executors_serve_others_is_noted_then_cleared(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    busy = await make_task(conn, team="team-a", subtasks=5)
    waiting = await make_task(conn, team="team-b", subtasks=5)
    await conn.execute("UPDATE tasks SET created_at = now() - interval '10 minutes'")
    ex = await make_executor(conn, token_id, preferences=[{"team": "team-a"}])
    assert [r["task_id"] for r in await _claim(conn, ex, token_id, 1)] == [busy]
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    assert [r["task_id"] for r in await conn.fetch("SELECT task_id FROM task_starvation")] == [waiting]
    # Not starving when no executor that could serve it is busy elsewhere: a waiting task of a
    # capability nobody serves is 'unservable', not starving.
    await make_task(conn, team="team-c", kind="embedding", model="m", subtasks=1)
    await conn.execute("UPDATE tasks SET created_at = now() - interval '10 minutes'")
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    assert [r["task_id"] for r in await conn.fetch("SELECT task_id FROM task_starvation")] == [waiting]
    other = await make_executor(conn, token_id)
    assert [r["task_id"] for r in await _claim(conn, other, token_id, 1)] == [waiting]
    await conn.fetchval(CYCLE, HOUR, 60, 300.0)
    assert await conn.fetchval("SELECT count(*) FROM task_starvation") == 0
    await conn.close()


async def test_an_unknown_team_gets_no_share_and_bad_values_are_refused(database_url: str) -> None:
    conn, _ = await _setup(database_url)
    assert await conn.fetchrow("SELECT * FROM minion_set_team_share('nobody', 2, NULL, NULL)") is None
    await make_task(conn, team="team-a", subtasks=1)
    for args, constraint in (((0.0, None, None), "team_shares_weight"),
                             ((None, -1001, None), "team_shares_priority_cap"),
                             ((None, None, -1), "team_shares_max_leases")):
        try:
            await conn.fetchrow("SELECT * FROM minion_set_team_share('team-a', $1, $2, $3)", *args)
        except asyncpg.CheckViolationError as exc:
            assert exc.constraint_name == constraint
        else:
            raise AssertionError(f"{args} accepted")
    row = await conn.fetchrow("SELECT * FROM minion_set_team_share('team-a', 2.5, 10, 4)")
    assert (row["weight"], row["priority_cap"], row["max_leases"]) == (2.5, 10, 4)
    row = await conn.fetchrow("SELECT * FROM minion_set_team_share('team-a', NULL, NULL, 0)")
    assert (row["weight"], row["priority_cap"], row["max_leases"]) == (2.5, 10, 0)
    await conn.close()
