"""Teams' shares over HTTP against a real database: an admin lists and sets each known team's weight,
priority cap and lease cap (every bad value a 422 naming its rule, an unknown team 422
`unknown_team`, anyone else 403), and a user's task priority is held to its team's cap (403
`priority_above_cap` naming it, nothing submitted) while an admin sets any priority."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from minions.db.connect import connect
from minions.testing.factories import make_token
from tests.support.api import ApiHarness, running_api


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[ApiHarness]:
    async with running_api(database_url, tmp_path / "store") as harness:
        yield harness


@pytest.fixture
async def object_api(database_url: str, tmp_path: Path) -> AsyncIterator[ApiHarness]:
    """Inline records stored as an input object, as bigger ones are (not kept in the database)."""
    async with running_api(database_url, tmp_path / "store", input_in_database_bytes=0) as harness:
        yield harness


async def _users(database_url: str) -> dict[str, str]:
    conn = await connect(database_url)
    try:
        return {"alpha": (await make_token(conn, "user", "alpha"))[0],
                "beta": (await make_token(conn, "user", "beta"))[0],
                "anyteam": (await make_token(conn, "user"))[0]}
    finally:
        await conn.close()


def _task(name: str, priority: int | None = None, team: str = "alpha") -> dict[str, Any]:
    task: dict[str, Any] = {"team": team, "project": "p", "name": name, "kind": "sleep",
                            "input": {"records": [{"id": 1, "ms": 1}, {"id": 2, "ms": 1}]}}
    if priority is not None:
        task["priority"] = priority
    return task


def _input_objects(api: ApiHarness) -> int:
    return len(list(Path(api.settings.store.removeprefix("file://")).rglob("*.jsonl")))


async def _task_priorities(database_url: str) -> dict[str, int]:
    conn = await connect(database_url)
    try:
        return {r["name"]: r["priority"] for r in await conn.fetch("SELECT name, priority FROM tasks")}
    finally:
        await conn.close()


async def test_an_admin_lists_and_sets_each_known_teams_share(api: ApiHarness, database_url: str) -> None:
    users = await _users(database_url)
    listed = await api.call("GET", "/api/v1/teams")
    assert listed.status == 200, listed.body
    assert listed.body["teams"] == [
        {"team": team, "weight": 1.0, "priority_cap": 0, "max_leases": 0, "updated_at": None}
        for team in ("alpha", "beta")]

    reply = await api.call("PATCH", "/api/v1/teams/alpha", json={"weight": 3})
    assert reply.status == 200, reply.body
    assert reply.body["weight"] == 3.0 and reply.body["priority_cap"] == 0 and reply.body["updated_at"]
    # Each field alone; the others keep their values.
    reply = await api.call("PATCH", "/api/v1/teams/alpha", json={"priority_cap": -5, "max_leases": 2})
    assert reply.status == 200, reply.body
    assert (reply.body["weight"], reply.body["priority_cap"], reply.body["max_leases"]) == (3.0, -5, 2)
    reply = await api.call("PATCH", "/api/v1/teams/beta", json={"weight": 0.25, "max_leases": 0})
    assert (reply.body["weight"], reply.body["priority_cap"], reply.body["max_leases"]) == (0.25, 0, 0)

    shares = {t["team"]: t for t in (await api.call("GET", "/api/v1/teams")).body["teams"]}
    assert (shares["alpha"]["weight"], shares["alpha"]["priority_cap"], shares["alpha"]["max_leases"]) == (3.0, -5, 2)
    # A team's user sees its own team only; a user scoped to no team may submit to any, and sees all.
    own = await api.call("GET", "/api/v1/teams", token=users["beta"])
    assert own.status == 200 and [t["team"] for t in own.body["teams"]] == ["beta"]
    every = await api.call("GET", "/api/v1/teams", token=users["anyteam"])
    assert [t["team"] for t in every.body["teams"]] == ["alpha", "beta"]
    # A task names a team too.
    assert (await api.call("POST", "/api/v1/tasks", json=_task("t1", team="gamma"))).status == 201
    assert (await api.call("PATCH", "/api/v1/teams/gamma", json={"weight": 2})).status == 200

    assert (await api.call("GET", "/api/v1/teams", token="executor")).error["code"] == "wrong_role"


async def test_bad_share_values_are_422_naming_the_rule_and_change_nothing(api: ApiHarness,
                                                                            database_url: str) -> None:
    users = await _users(database_url)
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"weight": 0}, "weight", "above 0"), ({"weight": -1}, "weight", "above 0"),
        ({"weight": 1_000_001}, "weight", "at most 1,000,000"), ({"weight": "2"}, "weight", "a number"),
        ({"weight": True}, "weight", "a number"), ({"weight": None}, "weight", "a number"),
        ({"max_leases": -1}, "max_leases", "from 0"),
        ({"priority_cap": 1001}, "priority_cap", "from -1000 to 1000"),
        ({"priority_cap": -1001}, "priority_cap", "from -1000 to 1000"),
        ({"priority_cap": 2.5}, "priority_cap", "an integer"), ({"priority_cap": "5"}, "priority_cap", "an integer"),
        ({"max_leases": 1.0}, "max_leases", "an integer"), ({"max_leases": 2**31}, "max_leases", "2147483647"),
        ({"weight": 2, "surprise": 1}, "surprise", "unknown field"), ({}, "body", "at least one of"),
    ]
    for body, field, rule in cases:
        reply = await api.call("PATCH", "/api/v1/teams/alpha", json=body)
        assert reply.status == 422 and reply.error["code"] == "invalid", (body, reply.body)
        assert rule in reply.error["fields"][field] and rule in reply.error["message"], (body, reply.body)

    for team in ("nobody", "not%20a%20name"):
        reply = await api.call("PATCH", f"/api/v1/teams/{team}", json={"weight": 2})
        assert reply.status == 422 and reply.error["code"] == "unknown_team", reply.body
        assert "names team" in reply.error["message"]
    for token in (users["alpha"], users["anyteam"], "executor"):
        reply = await api.call("PATCH", "/api/v1/teams/alpha", token=token, json={"priority_cap": 1000})
        assert reply.status == 403 and reply.error["code"] == "wrong_role", reply.body

    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM team_shares") == 0  # nothing was set
    finally:
        await conn.close()


async def test_a_users_priority_is_held_to_its_teams_cap(api: ApiHarness, database_url: str) -> None:
    users = await _users(database_url)
    alpha = users["alpha"]
    # The default cap is 0: a user's priority 0 and below pass, above it is refused, naming the cap.
    assert (await api.call("POST", "/api/v1/tasks", token=alpha, json=_task("default"))).status == 201
    assert (await api.call("POST", "/api/v1/tasks", token=alpha, json=_task("low", -1000))).status == 201
    reply = await api.call("POST", "/api/v1/tasks", token=alpha, json=_task("urgent", 1))
    assert reply.status == 403 and reply.error["code"] == "priority_above_cap", reply.body
    assert "cap of 0" in reply.error["message"] and "priority 1" in reply.error["message"]

    assert (await api.call("PATCH", "/api/v1/teams/alpha", json={"priority_cap": 5})).status == 200
    assert (await api.call("POST", "/api/v1/tasks", token=alpha, json=_task("at-cap", 5))).status == 201
    reply = await api.call("POST", "/api/v1/tasks", token=alpha, json=_task("above", 6))
    assert reply.status == 403 and "cap of 5" in reply.error["message"], reply.body
    # An admin sets any priority, in any team.
    assert (await api.call("POST", "/api/v1/tasks", json=_task("admin", 1000))).status == 201

    # A cap below 0: then the default priority 0 is above it.
    assert (await api.call("PATCH", "/api/v1/teams/alpha", json={"priority_cap": -10})).status == 200
    reply = await api.call("POST", "/api/v1/tasks", token=alpha, json=_task("zero"))
    assert reply.status == 403 and "cap of -10" in reply.error["message"], reply.body
    assert (await api.call("POST", "/api/v1/tasks", token=alpha, json=_task("at-negative-cap", -10))).status == 201
    # A user scoped to no team is held to the cap of the task's team; another team's cap is its own.
    reply = await api.call("POST", "/api/v1/tasks", token=users["anyteam"], json=_task("unscoped", 0))
    assert reply.status == 403 and "team alpha" in reply.error["message"], reply.body
    assert (await api.call("POST", "/api/v1/tasks", token=users["beta"], json=_task("b", 0, "beta"))).status == 201

    assert await _task_priorities(database_url) == {"default": 0, "low": -1000, "at-cap": 5, "admin": 1000,
                                                    "at-negative-cap": -10, "b": 0}


async def test_a_refused_priority_writes_no_input_object(object_api: ApiHarness, database_url: str) -> None:
    """Records stored as an object: the cap is judged before the object is written."""
    users = await _users(database_url)
    reply = await object_api.call("POST", "/api/v1/tasks", token=users["alpha"], json=_task("urgent", 1))
    assert reply.status == 403 and reply.error["code"] == "priority_above_cap", reply.body
    assert _input_objects(object_api) == 0
    assert (await object_api.call("POST", "/api/v1/tasks", token=users["alpha"], json=_task("fine", 0))).status == 201
    assert _input_objects(object_api) == 1
    assert await _task_priorities(database_url) == {"fine": 0}


async def test_only_an_admin_makes_a_team(object_api: ApiHarness, database_url: str) -> None:
    """A user scoped to no team who could make teams by naming them would take a fair share per name
    (1,000 made-up teams took 92% of the claims). Its task for a team nothing names is 403
    `unknown_team` (nothing created: no task, no input object); a team a token, task or share names
    is open to it; an admin makes teams as before; the OpenAI lane's default team is always open."""
    users = await _users(database_url)
    anyteam = users["anyteam"]
    for name in ("made-up-1", "made-up-2"):
        reply = await object_api.call("POST", "/api/v1/tasks", token=anyteam, json=_task(name, 0, name))
        assert reply.status == 403 and reply.error["code"] == "unknown_team", reply.body
        assert "only an admin makes a team" in reply.error["message"]
    dry = await object_api.call("POST", "/api/v1/tasks?dry_run=true", token=anyteam, json=_task("d", 0, "made-up-3"))
    assert dry.status == 403 and dry.error["code"] == "unknown_team", dry.body
    assert _input_objects(object_api) == 0
    # Teams that exist: beta (a scoped token names it), one an admin made by a task of its own, openai.
    assert (await object_api.call("POST", "/api/v1/tasks", token=anyteam, json=_task("b", 0, "beta"))).status == 201
    assert (await object_api.call("POST", "/api/v1/tasks", json=_task("admin", 0, "gamma"))).status == 201
    assert (await object_api.call("POST", "/api/v1/tasks", token=anyteam, json=_task("g", 0, "gamma"))).status == 201
    assert (await object_api.call("POST", "/api/v1/tasks", token=anyteam, json=_task("o", 0, "openai"))).status == 201
    judged = await object_api.call("POST", "/api/v1/tasks?dry_run=true", token=anyteam, json=_task("d", 0, "beta"))
    assert judged.status == 200 and judged.body == {"valid": True}, judged.body
    odd = await object_api.call("POST", "/api/v1/tasks?dry_run=maybe", token=anyteam, json=_task("d", 0, "beta"))
    assert odd.status == 422 and "dry_run" in odd.error["fields"], odd.body  # never read as a real submit
    assert await _task_priorities(database_url) == {"b": 0, "admin": 0, "g": 0, "o": 0}
