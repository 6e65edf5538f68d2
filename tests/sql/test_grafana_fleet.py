"""The fleet operator's Grafana: the panels of infra/grafana/dashboards/fleet.json and every alert
rule of infra/grafana/provisioning/alerting/minions.yaml run, expanded as Grafana would, as the
read-only minions_grafana role against a live schema; each rule fires on the state it is about and
stays quiet on a healthy one."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
import yaml

from minions.db.connect import connect
from minions.testing.factories import make_task, make_token, silence
from tests.support.grafana_macros import QueryContext, expand
from tests.support.paths import REPO

GRAFANA = REPO / "infra" / "grafana"
RULES = GRAFANA / "provisioning" / "alerting" / "minions.yaml"
DASHBOARD = GRAFANA / "dashboards" / "fleet.json"


def _rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["uid"]: r for group in doc["groups"] for r in group["rules"]}


async def _as_grafana(database_url: str) -> asyncpg.Connection:
    conn = await connect(database_url)
    await conn.execute("SET ROLE minions_grafana")
    return conn


def _ctx() -> QueryContext:
    """The last 2 hours and the next 10 minutes, in 5-minute steps: the last points come after
    anything the test did."""
    now = datetime.now(UTC)
    return QueryContext(time_from=now - timedelta(hours=2), time_to=now + timedelta(minutes=10),
                        interval=timedelta(minutes=5))


async def _firing(conn: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    """uid -> the rows (series) over the rule's threshold, the way Grafana evaluates it: query A,
    then a threshold on its numeric `value` column, one series per row (its other columns are labels)."""
    firing: dict[str, list[dict[str, Any]]] = {}
    for uid, rule in _rules().items():
        query = next(d for d in rule["data"] if d["refId"] == "A")
        assert query["datasourceUid"] == "minions-postgres", uid
        condition = next(d for d in rule["data"] if d["refId"] == rule["condition"])["model"]
        assert condition["type"] == "threshold" and condition["expression"] == "A", uid
        evaluator = condition["conditions"][0]["evaluator"]
        assert evaluator["type"] == "gt", uid
        try:
            rows = await conn.fetch(expand(query["model"]["rawSql"], _ctx()))
        except asyncpg.PostgresError as e:
            pytest.fail(f"rule {uid}: {e}")
        firing[uid] = [dict(r) for r in rows if r["value"] is not None and r["value"] > evaluator["params"][0]]
    return firing


async def test_rules_are_quiet_on_a_healthy_fleet(database_url: str) -> None:
    admin = await connect(database_url)
    try:
        _, token_id = await make_token(admin, "executor")
        await admin.fetchval("SELECT minion_register_executor($1, NULL, 'box', '{}'::jsonb, $2, $3, '[]'::jsonb)",
                             token_id, ["embedding"], ["m1"])
        await make_task(admin, kind="embedding", model="m1", subtasks=3)
    finally:
        await admin.close()
    conn = await _as_grafana(database_url)
    try:
        firing = await _firing(conn)
    finally:
        await conn.close()
    assert set(firing) == {"minions-no-executor", "minions-oldest-pending", "minions-failure-rate",
                           "minions-splitter-silent", "minions-watchdog-silent", "minions-starving"}
    assert not any(firing.values()), firing


async def test_the_starving_rule_fires_on_a_task_left_waiting_while_its_executors_serve_others(
        database_url: str) -> None:
    admin = await connect(database_url)
    try:
        _, token_id = await make_token(admin, "executor")
        busy = await make_task(admin, team="team-a", subtasks=3)
        waiting = await make_task(admin, team="team-b", subtasks=3)
        await admin.execute("UPDATE tasks SET created_at = now() - interval '10 minutes'")
        ex: uuid.UUID = await admin.fetchval(
            """SELECT minion_register_executor($1, NULL, 'box', '{}'::jsonb, ARRAY['sleep'], '{}',
                                               '[{"team": "team-a"}]'::jsonb)""", token_id)
        leased = await admin.fetch("SELECT * FROM minion_claim_batch($1, $2, 1)", ex, token_id)
        assert [r["task_id"] for r in leased] == [busy]
        await admin.fetchval("SELECT minion_fair_share_cycle(3600, 60, 300)")
        waiting_name = await admin.fetchval("SELECT name FROM tasks WHERE id = $1", waiting)
    finally:
        await admin.close()
    conn = await _as_grafana(database_url)
    try:
        firing = await _firing(conn)
    finally:
        await conn.close()
    assert [(r["team"], r["task_name"], r["value"] >= 600) for r in firing["minions-starving"]] == [
        ("team-b", waiting_name, True)]


async def test_each_rule_fires_on_its_problem(database_url: str) -> None:
    admin = await connect(database_url)
    try:
        _, token_id = await make_token(admin, "executor")
        box: uuid.UUID = await admin.fetchval(
            "SELECT minion_register_executor($1, NULL, 'box', '{}'::jsonb, $2, $3, '[]'::jsonb)",
            token_id, ["embedding"], ["m1"])
        mac: uuid.UUID = await admin.fetchval(
            "SELECT minion_register_executor($1, NULL, 'mac', '{}'::jsonb, $2, $3, '[]'::jsonb)",
            token_id, ["embedding"], ["m3"])
        # m1: served, and failing 10 attempts of 25.
        await make_task(admin, kind="embedding", model="m1", subtasks=25, max_attempts=20)
        for i in range(25):
            lease = await admin.fetchrow("SELECT * FROM minion_claim($1, 60)", box)
            if i < 10:
                assert await admin.fetchval("SELECT minion_fail($1, 'boom', true)", lease["lease_token"]) == "ok"
            else:
                assert await admin.fetchval("SELECT minion_complete($1, $2, 0.1)", lease["lease_token"],
                                            lease["records"]) == "ok"
        # m2: queued for two hours, and nobody serves it.
        old = await make_task(admin, kind="embedding", model="m2", subtasks=4)
        await admin.execute("UPDATE tasks SET created_at = now() - interval '2 hours' WHERE id = $1", old)
        # m3: its executor went silent holding a lease, and no watchdog reclaimed it.
        await make_task(admin, kind="embedding", model="m3", subtasks=1)
        assert await admin.fetchrow("SELECT * FROM minion_claim($1, 60)", mac) is not None
        await silence(admin, mac, 3600)
        # A task submitted ten minutes ago that no splitter picked up.
        await admin.execute(
            """INSERT INTO tasks (team, project, name, kind, model, subtask_size, max_attempts, input_uri,
                                  request_hash, created_at)
               VALUES ('search', 'ranker', 'unsplit', 'sleep', 'sleep', 1, 3, 'file:///x.jsonl', 'h',
                       now() - interval '10 minutes')""")
    finally:
        await admin.close()

    conn = await _as_grafana(database_url)
    try:
        firing = await _firing(conn)
        backlog = {r["model"]: dict(r) for r in await conn.fetch("SELECT * FROM grafana_backlog")}
    finally:
        await conn.close()
    assert {(r["team"], r["capability"]) for r in firing["minions-no-executor"]} == {("search", "embedding:m2")}
    assert {r["capability"] for r in firing["minions-oldest-pending"]} == {"embedding:m2"}
    assert [(r["model"], round(r["value"], 2)) for r in firing["minions-failure-rate"]] == [("m1", 0.4)]
    assert len(firing["minions-splitter-silent"]) == 1 and firing["minions-splitter-silent"][0]["value"] >= 600
    assert len(firing["minions-watchdog-silent"]) == 1 and firing["minions-watchdog-silent"][0]["value"] > 3000
    assert (backlog["m1"]["pending"], backlog["m1"]["online_executors"]) == (10, 1)
    assert (backlog["m2"]["pending"], backlog["m2"]["online_executors"]) == (4, 0)
    assert backlog["m2"]["oldest_pending_age_s"] >= 7200
    assert (backlog["m3"]["pending"], backlog["m3"]["leased"]) == (0, 1)


async def test_fleet_panels_run_as_the_readonly_role(database_url: str) -> None:
    admin = await connect(database_url)
    try:
        _, token_id = await make_token(admin, "executor")
        box: uuid.UUID = await admin.fetchval(
            "SELECT minion_register_executor($1, NULL, 'box', '{}'::jsonb, $2, $3, '[]'::jsonb)",
            token_id, ["embedding"], ["m1"])
        task = await make_task(admin, kind="embedding", model="m1", subtasks=3)
        await admin.execute("UPDATE tasks SET created_at = now() - interval '1 hour' WHERE id = $1", task)
        lease = await admin.fetchrow("SELECT * FROM minion_claim($1, 60)", box)
        assert await admin.fetchval("SELECT minion_complete($1, $2, 0.1)", lease["lease_token"],
                                    lease["records"]) == "ok"
    finally:
        await admin.close()
    dashboard = json.loads(DASHBOARD.read_text())
    conn = await _as_grafana(database_url)
    results: dict[str, list[asyncpg.Record]] = {}
    try:
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                sql = expand(target["rawSql"], _ctx())
                assert "$" not in sql, (panel["title"], sql)
                try:
                    results[panel["title"]] = await conn.fetch(sql)
                except asyncpg.PostgresError as e:
                    pytest.fail(f"panel {panel['title']!r}: {e}\n{sql}")
    finally:
        await conn.close()
    backlog = results["Backlog by model (outstanding subtasks)"]
    # Three outstanding from an hour ago until the first finished just now; two still outstanding.
    assert max(r["outstanding"] for r in backlog) == 3
    assert backlog[-1]["outstanding"] == 2 and {r["metric"] for r in backlog} == {"m1"}
    oldest = results["Oldest pending subtask by model"]
    assert [(r["metric"], r["oldest_pending_s"] >= 3600) for r in oldest] == [("m1", True)]
    assert [(r["model"], r["pending"], r["online_executors"]) for r in
            results["Queued work and who can take it"]] == [("m1", 2, 1)]
