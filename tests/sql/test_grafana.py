"""Grafana on Postgres views: the grafana_* views answer the dashboard's questions per team, the
minions_grafana role reads them and nothing else, and every panel of the provisioned dashboard runs,
expanded as Grafana would expand it, as that role against a live database."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import yaml

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token, silence
from tests.support.grafana_macros import (
    MacroError,
    QueryContext,
    expand,
    format_interval,
    rfc3339_nano,
)
from tests.support.paths import REPO
from tests.support.usage import build_pool

GRAFANA = REPO / "infra" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "minions.json"
ROLE = "minions_grafana"
HARDWARE: dict[str, Any] = {
    "device": "cpu", "chip": "Test CPU", "os": "Linux",
    "precision": [{"model": "m1", "device": "cpu", "precision": "bf16", "cosine": 0.99998, "setting": "auto"},
                  {"model": "m2", "device": "mlx-gpu", "precision": "fp16", "cosine": 0.99995, "setting": "auto",
                   "backend": "mlx"}],
}
# Panels that must show something for a team with a finished task.
KEY_PANELS = {
    "Executors online", "Executors idle", "Executors lost", "Executors by status", "Executors by hardware",
    "Tasks active", "Tasks completed", "Tasks by status", "Tasks by kind",
    "Records per minute by model", "Records per minute by kind", "Records by model (time range)",
    "Queue wait by model", "Subtask duration by model", "Subtask duration by hardware",
    "Failures by reason", "Top executors", "Failed and lost attempts per minute",
    "Executors per team and hardware", "Kinds and models", "Queue wait percentiles",
    "Duration percentiles by model", "Duration percentiles by hardware", "Failure reasons",
    "Executor contributions", "Records per minute by team", "Backend and precision by executor and model",
    "Compute used per team", "Team share vs weight", "Compute given per executor", "Compute given per owner",
}


async def _register(conn: asyncpg.Connection, token_id: int, name: str, hardware: dict[str, Any],
                    *, team: str | None = None, kinds: tuple[str, ...] = ("embedding",),
                    models: tuple[str, ...] = ("m1",)) -> uuid.UUID:
    executor_id: uuid.UUID = await conn.fetchval(
        "SELECT minion_register_executor($1, $2, $3, $4, $5, $6, '[]'::jsonb)",
        token_id, team, name, hardware, list(kinds), list(models),
    )
    return executor_id


async def _build(conn: asyncpg.Connection) -> dict[str, Any]:
    """Team 'search': task A finished (one failed attempt, then all done) by a shared CPU executor;
    task B running, its only lease lost by a silent Mac. Team 'other': a queued task and its own
    executor."""
    _, token_id = await make_token(conn, "executor")
    _, other_token = await make_token(conn, "executor", team="other")
    cpu = await _register(conn, token_id, "cpu-box", HARDWARE)
    mac = await _register(conn, token_id, "flaky-mac", {"device": "mps", "chip": "Apple M2", "os": "macOS"})
    await _register(conn, other_token, "other-box", {"device": "cuda", "chip": "L4", "os": "Linux"},
                    team="other", kinds=("sleep",), models=())

    task_a = await make_task(conn, team="search", kind="embedding", model="m1", subtasks=2,
                             records_per_subtask=5)
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", cpu)
    assert await conn.fetchval(
        "SELECT minion_fail($1, $2, true)", lease["lease_token"],
        "CUDA out of memory at 0x7f3a1c00 (tried to allocate 2.50 GiB)",
    ) == "ok"
    while (lease := await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", cpu)) is not None:
        verdict = await conn.fetchval("SELECT minion_complete($1, $2, 0.25)",
                                      lease["lease_token"], lease["records"])
        assert verdict == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_a) == "completed"

    task_b = await make_task(conn, team="search", kind="embedding", model="m1", subtasks=1,
                             records_per_subtask=5)
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", mac) is not None
    await silence(conn, mac, 3600)
    assert await conn.fetchval("SELECT minion_reclaim_executor($1, 120)", mac) == 1

    task_c = await make_task(conn, team="other", kind="sleep", model="sleep", subtasks=1)
    return {"cpu": cpu, "mac": mac, "task_a": task_a, "task_b": task_b, "task_c": task_c}


async def _as_grafana(database_url: str) -> asyncpg.Connection:
    conn = await connect(database_url)
    await conn.execute(f"SET ROLE {ROLE}")
    return conn


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


async def test_views_answer_per_team(database_url: str) -> None:
    admin = await connect(database_url)
    made = await _build(admin)
    conn = await _as_grafana(database_url)
    try:
        assert {r["team"] for r in await conn.fetch("SELECT team FROM grafana_teams")} == {"search", "other"}

        # Shared executors serve every team; a team's own executor only its team.
        rows = await conn.fetch("SELECT team, executor, status, online, scope, chip FROM grafana_executors")
        by_team: dict[str, dict[str, str]] = {}
        for r in rows:
            by_team.setdefault(r["team"], {})[r["executor"]] = r["status"]
        assert by_team["search"] == {"cpu-box": "idle", "flaky-mac": "lost"}
        assert by_team["other"] == {"cpu-box": "idle", "flaky-mac": "lost", "other-box": "idle"}
        counts = await conn.fetchrow(
            "SELECT * FROM grafana_executor_counts WHERE team = 'search' AND chip = 'Test CPU'")
        assert (counts["device"], counts["os"]) == ("cpu", "Linux")
        assert (counts["registered"], counts["online"], counts["busy"], counts["idle"], counts["lost"]) == (
            1, 1, 0, 1, 0)

        statuses = {(r["team"], r["phase"], r["status"]): r["tasks"]
                    for r in await conn.fetch("SELECT * FROM grafana_tasks_by_status")}
        assert statuses == {("search", "completed", "completed"): 1, ("search", "active", "running"): 1,
                            ("other", "active", "queued"): 1}

        km = await conn.fetchrow("SELECT * FROM grafana_kinds_models WHERE team = 'search'")
        assert (km["kind"], km["model"], km["tasks"], km["active_tasks"], km["records"], km["records_done"]) == (
            "embedding", "m1", 2, 1, 15, 10)

        per_minute = await conn.fetch("SELECT * FROM grafana_records_per_minute")
        assert sum(r["records"] for r in per_minute) == 10
        assert {(r["team"], r["kind"], r["model"]) for r in per_minute} == {("search", "embedding", "m1")}

        waits = {r["task_id"]: r for r in await conn.fetch("SELECT * FROM grafana_queue_wait")}
        assert not waits[made["task_a"]]["waiting"] and waits[made["task_a"]]["wait_s"] >= 0
        assert waits[made["task_c"]]["waiting"] and waits[made["task_c"]]["first_lease_at"] is None
        qw = await conn.fetchrow("SELECT * FROM grafana_queue_wait_percentiles WHERE team = 'search'")
        assert qw["tasks"] == 2 and qw["p95_s"] >= qw["p50_s"] >= 0

        dm = await conn.fetchrow("SELECT * FROM grafana_subtask_duration_by_model WHERE team = 'search'")
        assert (dm["subtasks"], dm["records"], dm["p50_compute_s"]) == (2, 10, 0.25)
        assert dm["p95_s"] >= dm["p50_s"] >= 0 and dm["records_per_compute_s"] == 20
        dh = await conn.fetch("SELECT * FROM grafana_subtask_duration_by_hardware WHERE team = 'search'")
        assert [(r["device"], r["chip"], r["os"], r["subtasks"]) for r in dh] == [("cpu", "Test CPU", "Linux", 2)]

        reasons = {(r["outcome"], r["reason"]): r["failures"]
                   for r in await conn.fetch("SELECT * FROM grafana_failures_by_reason WHERE team = 'search'")}
        assert reasons == {
            ("failed", "CUDA out of memory at <addr> (tried to allocate N GiB)"): 1,
            ("lost", "executor <id> lost: no heartbeat for N s"): 1,
        }

        top = {r["executor"]: r for r in await conn.fetch(
            "SELECT * FROM grafana_top_executors WHERE team = 'search' ORDER BY records_done DESC")}
        assert (top["cpu-box"]["subtasks_done"], top["cpu-box"]["records_done"], top["cpu-box"]["failures"],
                top["cpu-box"]["chip"]) == (2, 10, 1, "Test CPU")
        assert (top["flaky-mac"]["records_done"], top["flaky-mac"]["failures"]) == (0, 1)
        assert not await conn.fetch("SELECT * FROM grafana_top_executors WHERE team = 'other'")

        # The precision the agent reported with its hardware; executors that report none have no row.
        # An entry without a backend comes from an agent older than the choice: torch.
        precise = await conn.fetch("SELECT * FROM grafana_executor_precision ORDER BY team, model")
        assert [(r["team"], r["executor"], r["model"], r["precision"], r["cosine"], r["setting"], r["backend"])
                for r in precise] == [
            ("other", "cpu-box", "m1", "bf16", 0.99998, "auto", "torch"),  # a shared executor: under every team
            ("other", "cpu-box", "m2", "fp16", 0.99995, "auto", "mlx"),
            ("search", "cpu-box", "m1", "bf16", 0.99998, "auto", "torch"),
            ("search", "cpu-box", "m2", "fp16", 0.99995, "auto", "mlx"),
        ]
    finally:
        await conn.close()
        await admin.close()


async def test_every_dashboard_panel_runs_as_the_readonly_role(database_url: str) -> None:
    admin = await connect(database_url)
    await _build(admin)
    conn = await _as_grafana(database_url)
    dashboard = _dashboard()
    now = datetime.now(UTC)
    ctx = QueryContext(time_from=now - timedelta(hours=6), time_to=now + timedelta(minutes=5),
                       variables={"team": ["search"]})
    try:
        variable = dashboard["templating"]["list"][0]
        options = [r[0] for r in await conn.fetch(expand(variable["query"], ctx))]
        assert options == ["other", "search"]

        results: dict[str, list[asyncpg.Record]] = {}
        for panel in _panels(dashboard["panels"]):
            for target in panel.get("targets", []):
                sql = expand(target["rawSql"], ctx)
                assert "$" not in sql and "[[" not in sql, (panel["title"], sql)
                try:
                    results[panel["title"]] = await conn.fetch(sql)
                except asyncpg.PostgresError as e:
                    pytest.fail(f"panel {panel['title']!r}: {e}\n{sql}")
        assert KEY_PANELS <= results.keys()
        empty = sorted(title for title in KEY_PANELS if not results[title])
        assert not empty, f"panels without rows: {empty}"

        def stat(title: str) -> Any:
            return results[title][0][0]

        assert (stat("Executors online"), stat("Executors busy"), stat("Executors idle"),
                stat("Executors lost")) == (1, 0, 1, 1)
        assert (stat("Tasks active"), stat("Tasks completed"), stat("Tasks failed")) == (1, 1, 0)
        per_model = results["Records per minute by model"]
        assert {r["metric"] for r in per_model} == {"m1"} and sum(r["value"] for r in per_model) == 10
        assert all(r["time"] % 60 == 0 for r in per_model)
        assert {(r["model"], r["backend"]) for r in results["Backend and precision by executor and model"]} == {
            ("m1", "torch"), ("m2", "mlx")}
        top = results["Top executors"][0]
        assert (top["executor"], top["chip"], top["records_done"], top["subtasks_done"]) == (
            "cpu-box", "Test CPU", 10, 2)
        assert [r["chip"] for r in results["Subtask duration by hardware"]] == ["Test CPU"]
        assert {r["status"]: r["executors"] for r in results["Executors by status"]} == {"idle": 1, "lost": 1}

        # The other team sees its own executor and none of search's work.
        other = QueryContext(time_from=ctx.time_from, time_to=ctx.time_to, variables={"team": ["other"]})
        top_panel = next(p for p in _panels(dashboard["panels"]) if p["title"] == "Top executors")
        assert await conn.fetch(expand(top_panel["targets"][0]["rawSql"], other)) == []
    finally:
        await conn.close()
        await admin.close()


@pytest.mark.parametrize("sql", [
    "SELECT * FROM tasks",
    "SELECT * FROM subtask_attempts",
    "SELECT value FROM minion_settings",
    "SELECT token_hash FROM api_tokens",
    "SELECT * FROM minion_attempt_usage",  # grafana_usage is the role's way to the account
    "SELECT minion_cancel_task(1)",
    "UPDATE grafana_tasks SET status = 'cancelled'",
    "CREATE TABLE grafana_mine (x int)",
])
async def test_readonly_role_reads_views_only(database_url: str, sql: str) -> None:
    conn = await _as_grafana(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM grafana_tasks") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
            await conn.execute(sql)
    finally:
        await conn.close()


async def test_role_is_created_once_per_cluster(database_url: str) -> None:
    """The role block is idempotent: re-running the schema's role and grant blocks in another database
    of the same server (the role already exists) succeeds and grants again."""
    admin = await connect(database_url)
    try:
        sql = (REPO / "sql" / "schema" / "99_grants.sql").read_text()
        role_blocks = sql[sql.index("DO $$"):]
        await admin.execute(role_blocks)
        attrs = await admin.fetchrow(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = $1", ROLE)
        assert tuple(attrs) == (True, False, False, False)
        granted = await admin.fetch(
            """SELECT table_name, privilege_type FROM information_schema.role_table_grants
                WHERE grantee = $1 ORDER BY table_name""", ROLE)
        assert granted and all(r["table_name"].startswith("grafana_") for r in granted)
        assert {r["privilege_type"] for r in granted} == {"SELECT"}
    finally:
        await admin.close()


def test_provisioning_files_parse_and_agree() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "minions.yaml").read_text())
    assert datasources["apiVersion"] == 1
    [ds] = datasources["datasources"]
    assert ds["type"] == "grafana-postgresql-datasource" and ds["user"] == ROLE
    assert "${MINIONS_GRAFANA_DB_HOST}" in ds["url"]
    assert ds["jsonData"]["database"] == "${MINIONS_GRAFANA_DB_NAME}"

    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "minions.yaml").read_text())
    [provider] = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]

    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 39 and dashboard["uid"] == "minions-overview"
    assert dashboard["time"] == {"from": "now-6h", "to": "now"} and dashboard["refresh"]
    [team] = dashboard["templating"]["list"]
    assert (team["name"], team["multi"], team["includeAll"]) == ("team", True, True)
    assert team["datasource"]["uid"] == ds["uid"]
    ids = [p["id"] for p in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == ds["uid"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == ds["uid"]
            assert "team IN ($team)" in target["rawSql"], panel["title"]
            assert "grafana_" in target["rawSql"], panel["title"]
            if panel["type"] == "timeseries":
                assert target["format"] == "time_series" and "$__timeFilter(" in target["rawSql"]


def test_macros_expand_like_grafana() -> None:
    ctx = QueryContext(time_from=datetime(2024, 5, 1, 10, 0, tzinfo=UTC),
                       time_to=datetime(2024, 5, 1, 16, 0, 0, 250000, tzinfo=UTC),
                       interval=timedelta(seconds=20),
                       variables={"team": ["search", "o'brien"], "one": "it's"})
    assert expand("$__timeGroupAlias(ended_at, 1m)", ctx) == 'floor(extract(epoch from ended_at)/60)*60 AS "time"'
    assert expand("$__timeGroup(t, '5m') AS x", ctx) == "floor(extract(epoch from t)/300)*300 AS x"
    # Pre-5.3 compatibility: a bare $__timeGroup followed by ',' gets the alias.
    assert expand("SELECT $__timeGroup(t, 1h), v", ctx) == 'SELECT floor(extract(epoch from t)/3600)*3600 AS "time", v'
    assert expand("$__timeGroup(t, $__interval)", ctx) == "floor(extract(epoch from t)/20)*20"
    assert expand("$__timeFilter(ended_at)", ctx) == (
        "ended_at BETWEEN '2024-05-01T10:00:00Z' AND '2024-05-01T16:00:00.25Z'")
    assert expand("$__timeFrom() $__timeTo()", ctx) == "'2024-05-01T10:00:00Z' '2024-05-01T16:00:00.25Z'"
    assert expand("$__time(c) $__timeEpoch(c)", ctx) == 'c AS "time" extract(epoch from c) as "time"'
    assert expand("$__unixEpochFilter(e)", ctx) == "e >= 1714557600 AND e <= 1714579200"
    assert expand("$__interval $__interval_ms", ctx) == "20s 20000"
    for text in ("team IN ($team)", "team IN (${team})", "team IN ([[team]])"):
        assert expand(text, ctx) == "team IN ('search','o''brien')"
    assert expand("${team:csv} ${team:raw} ${team:sqlstring}", ctx) == (
        "search,o'brien search,o'brien 'search','o''brien'")
    assert expand("'$one' $teams $__from", ctx) == "'it''s' $teams 1714557600000"
    assert format_interval(timedelta(seconds=90)) == "1m" and format_interval(timedelta(days=2)) == "2d"
    assert rfc3339_nano(datetime(2024, 1, 1, tzinfo=UTC)) == "2024-01-01T00:00:00Z"
    with pytest.raises(MacroError):
        expand("$__nope(x)", ctx)
    with pytest.raises(MacroError):
        expand("$__timeGroup(x)", ctx)


async def _spot_checks(conn: asyncpg.Connection) -> dict[str, uuid.UUID]:
    """Team 'search', three executors of three owners (sql/schema/11_checks.sql's checks, every lease checked): 'liar'
    commits one result of an open task unchecked, then loses a quorum to 'honest' and 'referee' and is
    quarantined by hand (its committed result revoked); 'referee' holds a result until the check times
    out (unchecked); 'honest' holds one still (candidate)."""
    await conn.execute("SET minions.spot_check_share = '0'")
    await conn.execute("SET minions.trust_agreements = '0'")
    made: dict[str, uuid.UUID] = {}
    for name, label in (("liar", "mallory"), ("honest", "alice"), ("referee", "")):
        _, token_id = await make_token(conn, "executor")
        await conn.execute("UPDATE api_tokens SET label = $2 WHERE id = $1", token_id, label)
        made[name] = await make_executor(conn, token_id, name=name)
    claim = "SELECT * FROM minion_claim_batch($1, NULL, 1) WHERE verdict = 'leased'"
    complete = "SELECT minion_complete($1, 1, 0.01, NULL, NULL, NULL, NULL)"
    vote = "SELECT minion_check_vote($1, 1, 0.01, NULL, NULL, NULL, NULL, NULL, $2::smallint)"

    open_task = await make_task(conn, name="open", subtasks=2)
    lease = await conn.fetchrow(claim, made["liar"])
    assert lease["task_id"] == open_task and await conn.fetchval(complete, lease["lease_token"]) == "ok"

    # From here every lease is checked; the checked tasks come first in the queue.
    await conn.execute("SET minions.spot_check_share = '1'")
    await conn.execute("SET minions.trust_agreements = '1'")
    await make_task(conn, name="disputed", subtasks=1, priority=10)
    held = await conn.fetchrow(claim, made["liar"])
    assert await conn.fetchval(complete, held["lease_token"]) == "held"
    second = await conn.fetchrow(claim, made["honest"])
    assert second["task_id"] == held["task_id"]
    assert await conn.fetchval(vote, second["lease_token"], None) == "disputed"
    # The referee earned trust before (agreeing with a trusted executor is what earns a volunteer
    # trust: sql/schema/11_checks.sql), so its agreement earns honest its own; it is still checked.
    await conn.execute("UPDATE executors SET trusted = true WHERE id = $1", made["referee"])
    third = await conn.fetchrow(claim, made["referee"])
    assert await conn.fetchval(vote, third["lease_token"], 2) == "agreed"  # with honest's
    assert await conn.fetchval("SELECT minion_quarantine_executor($1, 'returned random vectors')",
                               made["liar"]) == 1  # its result in the open task runs again

    await make_task(conn, name="stale", subtasks=1, priority=10)
    lease = await conn.fetchrow(claim, made["referee"])
    assert await conn.fetchval(complete, lease["lease_token"]) == "held"
    # Vouched for once held: its lone result commits unchecked after the wait (a volunteer's stays held).
    await conn.execute("UPDATE api_tokens SET trusted = true WHERE id = (SELECT token_id FROM executors WHERE id = $1)",
                       made["referee"])
    assert await conn.fetchval("SELECT minion_settle_stale_checks(0)") == 1
    await make_task(conn, name="held", subtasks=1, priority=10)
    lease = await conn.fetchrow(claim, made["honest"])
    assert await conn.fetchval(complete, lease["lease_token"]) == "held"
    return made


async def test_trust_views_and_panels(database_url: str) -> None:
    admin = await connect(database_url)
    made = await _spot_checks(admin)
    # A team's own executor, and a team with no spot checks: the other team sees neither liar nor checks.
    _, other_token = await make_token(admin, "executor", team="other")
    await make_executor(admin, other_token, name="other-box", team="other")
    await make_task(admin, team="other", subtasks=1)
    conn = await _as_grafana(database_url)
    try:
        trust = {r["executor"]: r for r in await conn.fetch(
            "SELECT * FROM grafana_executor_trust WHERE team = 'search'")}
        assert set(trust) == {"liar", "honest", "referee"}
        liar = trust["liar"]
        assert (liar["owner"], liar["trust"], liar["trusted"], liar["quarantined"], liar["quarantine_reason"]) == (
            "mallory", "quarantined", False, True, "returned random vectors")
        assert liar["quarantined_at"] is not None and (liar["agreements"], liar["disagreements"]) == (0, 1)
        counts = ("agreed_24h", "outvoted_24h", "revoked_24h", "unchecked_24h", "candidate_24h")
        assert {name: tuple(r[c] for c in counts) for name, r in trust.items()} == {
            "liar": (0, 1, 1, 0, 0), "honest": (0, 0, 0, 0, 1), "referee": (1, 0, 0, 1, 0)}
        assert (trust["honest"]["owner"], trust["honest"]["trust"], trust["honest"]["agreements"]) == (
            "alice", "trusted", 1)
        assert trust["referee"]["owner"] is None and trust["referee"]["quarantine_reason"] is None
        # Shared executors serve every team; a team's own executor only its team.
        assert {r["executor"] for r in await conn.fetch(
            "SELECT executor FROM grafana_executor_trust WHERE team = 'other'")} == {
            "liar", "honest", "referee", "other-box"}

        outcomes = await conn.fetch("SELECT * FROM grafana_spot_check_outcomes")
        assert {(r["team"], r["outcome"]): r["attempts"] for r in outcomes} == {
            ("search", "agreed"): 1, ("search", "outvoted"): 1, ("search", "revoked"): 1,
            ("search", "unchecked"): 1, ("search", "candidate"): 1}
        assert all(r["time"].second == 0 and r["time"].microsecond == 0 for r in outcomes)

        panels = {p["title"]: p for p in _panels(_dashboard()["panels"])}
        now = datetime.now(UTC)

        async def run(title: str, team: str) -> list[asyncpg.Record]:
            ctx = QueryContext(time_from=now - timedelta(hours=6), time_to=now + timedelta(minutes=5),
                               variables={"team": [team]})
            rows: list[asyncpg.Record] = await conn.fetch(expand(panels[title]["targets"][0]["rawSql"], ctx))
            return rows

        disagreements = await run("Disagreements by executor", "search")
        top = disagreements[0]
        assert (top["executor"], top["trust"], top["disagreements"], top["outvoted_24h"]) == (
            "liar", "quarantined", 1, 1)
        assert sorted(r["executor"] for r in disagreements) == ["honest", "liar", "referee"]
        # A shared executor is one row over several teams.
        both = QueryContext(time_from=now - timedelta(hours=6), time_to=now, variables={"team": ["search", "other"]})
        rows = await conn.fetch(expand(panels["Disagreements by executor"]["targets"][0]["rawSql"], both))
        assert sorted(r["executor"] for r in rows) == ["honest", "liar", "other-box", "referee"]

        quarantined = await run("Quarantined executors", "search")
        assert [(r["executor"], r["reason"], r["owner"]) for r in quarantined] == [
            ("liar", "returned random vectors", "mallory")]
        assert quarantined[0]["quarantined_at"] == liar["quarantined_at"]

        series = await run("Spot-check outcomes", "search")
        assert {r["metric"]: r["value"] for r in series} == {
            "agreed": 1, "outvoted": 1, "revoked": 1, "unchecked": 1, "candidate": 1}
        assert all(now - timedelta(minutes=5) < r["time"] <= now for r in series)
        assert await run("Spot-check outcomes", "other") == []

        # Released: off the quarantined panel, checked again from scratch.
        await admin.fetchval("SELECT minion_release_quarantine($1)", made["liar"])
        assert await run("Quarantined executors", "search") == []
        released = await conn.fetchrow("SELECT trust, disagreements FROM grafana_executor_trust "
                                       "WHERE executor = 'liar' LIMIT 1")
        assert (released["trust"], released["disagreements"]) == ("checked", 0)
    finally:
        await conn.close()
        await admin.close()


async def test_trust_views_read_only_the_checked_attempts(database_url: str) -> None:
    """Neither view scans the hot path's attempts: with 20,000 attempts of which 2 % are checks',
    both read the partial index of checks' attempts (sql/schema/13_grafana.sql), never the whole table."""
    admin = await connect(database_url)
    try:
        _, token_id = await make_token(admin, "executor")
        executor = await make_executor(admin, token_id, name="busy")
        task = await make_task(admin, subtasks=1000)
        await admin.execute(
            """INSERT INTO subtask_attempts (task_id, subtask_id, attempt, executor_id, lease_token, started_at,
                                             ended_at, outcome)
               SELECT $1, i % 1000, i, $2, gen_random_uuid(), now() - make_interval(secs => i),
                      now() - make_interval(secs => i / 4),
                      CASE i % 100 WHEN 0 THEN 'agreed' WHEN 1 THEN 'candidate' ELSE 'done' END
                 FROM generate_series(1, 20000) i""", task, executor)
        await admin.execute("ANALYZE subtask_attempts")
        for view in ("grafana_executor_trust", "grafana_spot_check_outcomes"):
            plan = "\n".join(r[0] for r in await admin.fetch(f"EXPLAIN SELECT * FROM {view}"))
            assert "subtask_attempts_spot_checked" in plan, plan
            assert "Seq Scan on subtask_attempts" not in plan, plan
        trust = await admin.fetchrow("SELECT * FROM grafana_executor_trust WHERE executor = 'busy'")
        assert (trust["agreed_24h"], trust["candidate_24h"]) == (200, 200)
    finally:
        await admin.close()


async def test_usage_views_and_panels(database_url: str) -> None:
    """The usage panels as the read-only role agree with the account (minion_usage, sql/schema/16_usage.sql)
    per team, executor and owner; a team's share of the charged compute is set against its weight
    (team_shares, 1 by default) among the teams that used the pool."""
    admin = await connect(database_url)
    pool = await build_pool(admin)
    assert await admin.fetchval("SELECT count(*) FROM minion_set_team_share('search', 3, NULL, NULL)") == 1
    account = {by: {r[by]: r for r in await admin.fetch(
        "SELECT * FROM minion_usage(now() - interval '1 day', NULL, $1)", by)} for by in ("team", "executor", "owner")}
    conn = await _as_grafana(database_url)
    try:
        assert {(r["team"], r["weight"]) for r in await conn.fetch("SELECT * FROM grafana_team_weights")} == {
            ("search", 3), ("ads", 1)}
        panels = {p["title"]: p for p in _panels(_dashboard()["panels"])}
        now = datetime.now(UTC)
        # One interval over the whole range, one point a series: a bucket of whole days (Grafana's
        # `$__interval` units) that starts over a day before now and ends over a day after.
        days = next(d for d in range(300, 400) if 86400 < now.timestamp() % (d * 86400) < (d - 1) * 86400)
        ctx = QueryContext(time_from=now - timedelta(hours=6), time_to=now + timedelta(minutes=5),
                           interval=timedelta(days=days), variables={"team": ["search", "ads"]})

        async def run(title: str, context: QueryContext = ctx) -> list[asyncpg.Record]:
            rows: list[asyncpg.Record] = await conn.fetch(expand(panels[title]["targets"][0]["rawSql"], context))
            return rows

        used = {r["metric"]: r["value"] for r in await run("Compute used per team")}
        assert used == {team: pytest.approx(r["used_s"]) for team, r in account["team"].items()}
        for title, key, columns in (("Compute given per executor", "executor", ("used_s", "verification_s", "lost_s")),
                                    ("Compute given per owner", "owner", ("used_s", "verification_s", "lost_s"))):
            rows = {r[key]: r for r in await run(title)}
            assert set(rows) == set(account[key]), title
            for name, r in rows.items():
                assert [r[c] or 0 for c in columns] == [pytest.approx(account[key][name][c]) for c in columns], name
        assert {r["owner"]: r["executors"] for r in await run("Compute given per owner")} == {
            "alice": 3, "bob": 1, "mallory": 1, f"token {pool.unlabelled_token}": 2}

        series = {r["metric"]: r["value"] for r in await run("Team share vs weight")}
        charged = {t: r["used_s"] + r["verification_s"] for t, r in account["team"].items()}
        assert series == {
            "search share": pytest.approx(100 * charged["search"] / sum(charged.values())),
            "ads share": pytest.approx(100 * charged["ads"] / sum(charged.values())),
            "search weight": pytest.approx(75), "ads weight": pytest.approx(25)}
        # One team selected: its own series, its share still of every team's compute.
        ads_only = QueryContext(time_from=ctx.time_from, time_to=ctx.time_to, interval=ctx.interval,
                                variables={"team": ["ads"]})
        assert {r["metric"]: r["value"] for r in await run("Team share vs weight", ads_only)} == {
            "ads share": series["ads share"], "ads weight": pytest.approx(25)}
        assert {r["metric"] for r in await run("Compute used per team", ads_only)} == {"ads"}
        assert {r["executor"] for r in await run("Compute given per executor", ads_only)} == {"bob-box", "lab-box"}
    finally:
        await conn.close()
        await admin.close()
