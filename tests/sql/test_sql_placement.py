"""Placement (sql/schema/06_leases.sql, 11_checks.sql): a task placed `trusted` is leased only by
executors of a token an admin vouched for. A volunteer's claim passes over it on every path (the whole
queue, a team's queue, a project or task preference, a straggler's backup) and takes the work behind
it; it is never starved by a trusted task ahead of it in the queue."""

from __future__ import annotations

import uuid

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token

CLAIM = "SELECT * FROM minion_claim_batch($1, NULL, $2) WHERE verdict = 'leased'"


async def _executors(conn: asyncpg.Connection, team: str | None = None) -> tuple[uuid.UUID, uuid.UUID]:
    _, volunteer_token = await make_token(conn, "executor")
    _, vouched_token = await make_token(conn, "executor", trusted=True)
    volunteer = await make_executor(conn, volunteer_token, name="volunteer")
    vouched = await make_executor(conn, vouched_token, name="vouched")
    if team is not None:
        await conn.execute("UPDATE executors SET team = $1", team)
    return volunteer, vouched


async def test_a_volunteer_passes_over_a_trusted_task_and_a_vouched_executor_takes_it(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        secret = await make_task(conn, name="secret", subtasks=3, priority=5, placement="trusted")
        public = await make_task(conn, name="public", subtasks=3)
        volunteer, vouched = await _executors(conn)
        taken = await conn.fetch(CLAIM, volunteer, 8)
        assert {r["task_id"] for r in taken} == {public} and len(taken) == 3
        one = await conn.fetch(CLAIM, volunteer, 1)  # one at a time too (the single-lease path)
        assert one == []
        taken = await conn.fetch(CLAIM, vouched, 8)
        assert {r["task_id"] for r in taken} == {secret} and len(taken) == 3
        assert await conn.fetchval("SELECT placement FROM tasks WHERE id = $1", secret) == "trusted"
    finally:
        await conn.close()


async def test_a_volunteers_preference_and_team_queue_pass_over_a_trusted_task(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        secret = await make_task(conn, project="p", name="secret", subtasks=2, placement="trusted", priority=5)
        public = await make_task(conn, project="p", name="public", subtasks=2)
        volunteer, _ = await _executors(conn, team="search")  # a team's executor: the team's queue
        await conn.execute("INSERT INTO executor_preferences (executor_id, position, team, project, task_name)"
                           " VALUES ($1, 0, 'search', 'p', 'secret'), ($1, 1, 'search', 'p', NULL)", volunteer)
        taken = await conn.fetch(CLAIM, volunteer, 8)
        assert {r["task_id"] for r in taken} == {public}
        assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND state = 'pending'",
                                   secret) == 2
    finally:
        await conn.close()


async def test_a_volunteer_backs_up_no_straggler_of_a_trusted_task(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        secret = await make_task(conn, name="secret", subtasks=4, placement="trusted")
        volunteer, vouched = await _executors(conn)
        leases = await conn.fetch(CLAIM, vouched, 4)
        for lease in leases[:3]:  # three finished attempts: a median to back up stragglers against
            assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", lease["lease_token"]) == "ok"
        await conn.execute("UPDATE subtasks SET leased_at = now() - interval '1 hour' WHERE task_id = $1"
                           " AND state = 'leased'", secret)
        assert await conn.fetch("SELECT * FROM minion_claim_batch($1, NULL, 1, 2.0) WHERE verdict = 'leased'",
                                volunteer) == []
        _, other_token = await make_token(conn, "executor", trusted=True)
        other = await make_executor(conn, other_token, name="other-vouched")
        [backup] = await conn.fetch("SELECT * FROM minion_claim_batch($1, NULL, 1, 2.0) WHERE verdict = 'leased'",
                                    other)
        assert backup["task_id"] == secret and backup["backup"] is True
    finally:
        await conn.close()
