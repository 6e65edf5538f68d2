"""The usage account (sql/schema/16_usage.sql, GET /api/v1/usage): each team's, executor's and
owner's totals are the sums of their attempts' seconds, spot-check replicas are the team's
verification, lost work is nobody's use; a team's token sees its team only; bad input is 422 naming
the rule; the window is read through the index on ended_at."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from minions.db.connect import connect
from minions.kinds import ATTEMPT_OUTCOMES
from minions.testing.factories import make_executor, make_task, make_token
from tests.support.api import running_api
from tests.support.usage import LOST_LEASE_S, USE, Pool, account, attempts, build_pool

COUNTS = ("used_s", "verification_s", "lost_s", "records", "attempts")
WEEK_AGO = "now() - interval '7 days'"


async def _usage(conn: asyncpg.Connection, by: str, team: str | None = None,
                 since: str = WEEK_AGO) -> dict[str | None, dict[str, Any]]:
    key = by if by in ("executor", "owner") else "team"
    rows = await conn.fetch(f"SELECT * FROM minion_usage({since}, $1, $2)", team, by)
    return {r[key]: {c: r[c] for c in COUNTS} for r in rows}


def _approx(expected: dict[str | None, dict[str, float]]) -> dict[str | None, Any]:
    return {k: {c: pytest.approx(v, abs=1e-9) for c, v in counts.items()} for k, counts in expected.items()}


@pytest.fixture
async def pool(database_url: str) -> Pool:
    conn = await connect(database_url)
    try:
        return await build_pool(conn)
    finally:
        await conn.close()


async def test_every_outcome_has_a_use() -> None:
    """A new outcome without a place in the account would count nowhere: the schema and this test's
    reading of docs/API.md give every outcome the same use."""
    assert set(USE) == set(ATTEMPT_OUTCOMES)


async def test_the_schema_classifies_outcomes_as_documented(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        uses = {o: await conn.fetchval("SELECT minion_attempt_use($1)", o) for o in ATTEMPT_OUTCOMES}
        assert uses == USE
        assert await conn.fetchval("SELECT minion_attempt_use('teleported')") is None
    finally:
        await conn.close()


async def test_totals_are_the_sums_of_the_attempts_per_team_executor_and_owner(database_url: str, pool: Pool) -> None:
    conn = await connect(database_url)
    try:
        rows = await attempts(conn)
        assert {r["outcome"] for r in rows} == set(ATTEMPT_OUTCOMES) - {"superseded"}
        for by in ("team", "executor", "owner"):
            assert await _usage(conn, by) == _approx(account(rows, by)), by

        teams = await _usage(conn, "team")
        # Spot checks: lab-2's agreeing replica (0.04 s) and the liar's outvoted result (0.01 s) are
        # search's verification; the liar's revoked result (0.01 s) and the 30 s lease lost are nobody's.
        assert teams["search"]["verification_s"] == pytest.approx(0.05)
        assert teams["search"]["lost_s"] == pytest.approx(LOST_LEASE_S + 0.01, abs=2.0)
        used = 0.5 + 1.25 + 2.0 + 0.25 + 0.02 + 0.04 + 0.02  # done, unchecked, candidate; + the failure's wall time
        assert used <= teams["search"]["used_s"] < used + 2.0
        assert teams["search"]["records"] == 4 + 5 + 5 + 3 + 1 + 1 + 1
        # ads: bob's two done (3 s, 1 s), his released lease nobody's, the cancelled run ads' own.
        assert 4.0 <= teams["ads"]["used_s"] < 6.0 and teams["ads"]["verification_s"] == 0
        assert (teams["ads"]["records"], teams["ads"]["attempts"]) == (4, 4)

        owners = await _usage(conn, "owner")
        assert set(owners) == {"alice", "bob", "mallory", f"token {pool.unlabelled_token}"}
        assert owners["mallory"]["used_s"] == 0 and owners["mallory"]["verification_s"] == pytest.approx(0.01)
        assert owners["mallory"]["lost_s"] == pytest.approx(0.01)
        by_executor = await conn.fetch(f"SELECT * FROM minion_usage({WEEK_AGO}, NULL, 'executor')")
        assert {(r["executor"], r["owner"], r["team"]) for r in by_executor} >= {
            ("alice-air", "alice", None), ("lab-2", f"token {pool.unlabelled_token}", None)}
        assert {str(r["executor_id"]) for r in by_executor} == {str(v) for v in pool.executors.values()}
        # Most compute first.
        charged = [r["used_s"] + r["verification_s"] + r["lost_s"] for r in by_executor]
        assert charged == sorted(charged, reverse=True)
    finally:
        await conn.close()


async def test_a_team_and_a_window(database_url: str, pool: Pool) -> None:
    conn = await connect(database_url)
    try:
        rows = await attempts(conn)
        only_ads = [r for r in rows if r["team"] == "ads"]
        assert await _usage(conn, "executor", "ads") == _approx(account(only_ads, "executor"))
        assert set(await _usage(conn, "team", "ads")) == {"ads"}
        assert await _usage(conn, "team", "nobody") == {}
        assert await _usage(conn, "teams") == {}  # not a grouping: no rows

        # Attempts that ended before the window are left out.
        await conn.execute("UPDATE subtask_attempts SET ended_at = ended_at - interval '8 days' WHERE task_id = $1",
                           pool.tasks["a-main"])
        recent = [r for r in await attempts(conn) if r["ended_at"] >= datetime.now(UTC) - timedelta(days=7)]
        assert await _usage(conn, "team") == _approx(account(recent, "team"))
        assert (await _usage(conn, "team"))["ads"]["attempts"] == 1  # the cancelled run only
        assert (await _usage(conn, "team", since="now() - interval '30 days'"))["ads"]["attempts"] == 4
    finally:
        await conn.close()


async def test_the_window_reads_the_index_on_ended_at(database_url: str) -> None:
    """Two weeks of attempts, one a minute: the last hour's usage is read through subtask_attempts_ended,
    never by a scan of the whole history."""
    conn = await connect(database_url)
    try:
        _, token_id = await make_token(conn, "executor")
        executor = await make_executor(conn, token_id, name="busy")
        task = await make_task(conn, subtasks=1000)
        # Volume for the planner only (the account's arithmetic is tested on attempts made by the SQL
        # functions above): hand-written rows.
        await conn.execute(
            """INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                             ended_at, outcome, records, seconds)
               SELECT $1, i % 1000, i, $2, gen_random_uuid(), now() - make_interval(mins => i, secs => 2),
                      now() - make_interval(mins => i), 'done', 1, 1.5
                 FROM generate_series(1, 20160) i""", task, executor)
        await conn.execute("ANALYZE subtask_attempts")
        for by in ("team", "executor", "owner"):
            plan = "\n".join(r[0] for r in await conn.fetch(
                f"EXPLAIN SELECT * FROM minion_usage(now() - interval '1 hour', NULL, '{by}')"))
            assert "subtask_attempts_ended" in plan, plan
            assert "Seq Scan on subtask_attempts" not in plan, plan
        row = await conn.fetchrow("SELECT * FROM minion_usage(now() - interval '1 hour' - interval '1 second', "
                                  "NULL, 'team')")
        assert (row["attempts"], row["used_s"]) == (60, 90.0)
    finally:
        await conn.close()


async def test_the_api_shows_a_team_its_own_usage_and_an_admin_all(database_url: str, tmp_path: Path,
                                                                    pool: Pool) -> None:
    conn = await connect(database_url)
    search_user, _ = await make_token(conn, "user", team="search")
    anyone, _ = await make_token(conn, "user")
    rows = await attempts(conn)
    await conn.close()
    async with running_api(database_url, tmp_path / "store") as api:
        reply = await api.call("GET", "/api/v1/usage")
        assert reply.status == 200, reply.body
        body = reply.body
        assert (body["team"], body["by"]) == (None, "team")
        since = datetime.fromisoformat(body["since"])
        assert timedelta(days=7) <= datetime.now(UTC) - since < timedelta(days=7, minutes=1)
        expected = account(rows, "team")
        assert {r["team"]: {c: r[c] for c in COUNTS} for r in body["usage"]} == _approx(expected)
        assert body["totals"] == {c: pytest.approx(sum(e[c] for e in expected.values())) for c in COUNTS}
        assert all(r["executor"] is None and r["owner"] is None for r in body["usage"])

        # A team's token: its own team, by default and by name; another team is refused.
        for query in ("?by=executor", "?by=executor&team=search"):
            reply = await api.call("GET", "/api/v1/usage" + query, token=search_user)
            assert reply.status == 200 and reply.body["team"] == "search", reply.body
            got = {r["executor"]: {c: r[c] for c in COUNTS} for r in reply.body["usage"]}
            assert got == _approx(account([r for r in rows if r["team"] == "search"], "executor"))
            assert "bob-box" in got and all(r["owner"] for r in reply.body["usage"])
        reply = await api.call("GET", "/api/v1/usage?team=ads", token=search_user)
        assert reply.status == 403 and reply.error["code"] == "wrong_team", reply.body
        reply = await api.call("GET", "/api/v1/usage?team=ads&by=owner&since=30d", token=anyone)
        assert reply.status == 200, reply.body
        assert {r["owner"] for r in reply.body["usage"]} == {"bob", f"token {pool.unlabelled_token}"}
        reply = await api.call("GET", "/api/v1/usage", token="executor")
        assert reply.status == 403 and reply.error["code"] == "wrong_role"

        reply = await api.call("GET", "/api/v1/usage?since=1h")
        assert reply.status == 200 and reply.body["usage"]
        reply = await api.call("GET", "/api/v1/usage?since=1s")
        assert reply.status == 200


@pytest.mark.parametrize(("query", "field", "rule"), [
    ("since=yesterday", "since", "a duration back from now such as 3600, 90m, 12h, 7d or 2w"),
    ("since=0d", "since", "above 0"),
    ("since=-7d", "since", "above 0"),
    ("since=4000w", "since", "at most 10 years"),
    ("by=project", "by", "one of team, executor, owner"),
    ("team=bad%20team!", "team", "not a valid name"),
])
async def test_bad_input_is_422_naming_the_rule(database_url: str, tmp_path: Path, query: str, field: str,
                                                rule: str) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        reply = await api.call("GET", f"/api/v1/usage?{query}")
        assert reply.status == 422 and reply.error["code"] == "invalid", reply.body
        assert rule in reply.error["fields"][field], reply.error
