"""What a team sees of shared executors. A team's token must not learn, from any
endpoint that shows executors or subtasks, another team's preferences, task names or work, nor the
hardware of executors outside its team; an admin sees all. (The web UI renders what
`GET /api/v1/executors` answers, so the API's answer is what is checked here.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.factories import make_task, make_token
from tests.support.api import ApiHarness, running_api

SECRET_CHIP = "Apple M9 Ultra (owned by dana)"
SHARED_PREFS = [{"team": "teamb", "project": "secretproj", "task_name": "launch-plan"},
                {"team": "teama", "project": "ranker", "task_name": None}]


async def _register(api: ApiHarness, name: str, token: str, chip: str, memory_gb: int,
                    preferences: list[dict[str, Any]]) -> str:
    reply = await api.call("POST", "/api/v1/executors/register", token=token, json={
        "name": name, "hardware": {"chip": chip, "memory_gb": memory_gb, "os": "macOS 15.1", "device": "mps"},
        "kinds": ["sleep"], "preferences": preferences})
    assert reply.status == 201, reply.body
    executor_id: str = reply.body["executor_id"]
    return executor_id


def _by_name(body: Any) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in body["executors"]}


async def test_a_team_sees_no_other_teams_secrets_of_a_shared_executor(database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        conn = await connect(database_url)
        try:
            user_a, _ = await make_token(conn, "user", "teama")
            user_b, _ = await make_token(conn, "user", "teamb")
            executor_a, _ = await make_token(conn, "executor", "teama")
            await make_task(conn, team="teamb", project="secretproj", name="launch-plan", subtasks=2,
                            input_uri=(tmp_path / "store" / "inputs" / "b.jsonl").as_uri())
        finally:
            await conn.close()
        shared = await _register(api, "shared-1", "executor", SECRET_CHIP, 1536, SHARED_PREFS)
        await _register(api, "team-a-box", executor_a, "Apple M2", 16, [{"team": "teama"}])
        claim = await api.call("POST", f"/api/v1/executors/{shared}/claim?wait=0")
        assert claim.status == 200 and claim.body["subtask"]["task_name"] == "launch-plan", claim.body

        # Team A: the shared executor, with neither its hardware nor team B's preference or work.
        reply = await api.call("GET", "/api/v1/executors", token=user_a)
        assert reply.status == 200, reply.body
        raw = jsoncodec.dumps(reply.body).decode()
        for secret in ("teamb", "secretproj", "launch-plan", SECRET_CHIP, "1536"):
            assert secret not in raw, f"team A's executor list shows {secret!r}: {raw}"
        seen = _by_name(reply.body)
        assert set(seen) == {"shared-1", "team-a-box"}
        assert seen["shared-1"]["hardware"] == {} and seen["shared-1"]["details_hidden"] is True
        assert seen["shared-1"]["preferences"] == [SHARED_PREFS[1]]
        assert seen["shared-1"]["current"] == []
        assert seen["shared-1"]["status"] == "busy"  # that it works is not a secret; for whom is
        # Its own team's executor: all of it.
        assert seen["team-a-box"]["hardware"]["chip"] == "Apple M2" and seen["team-a-box"]["details_hidden"] is False

        # Team B: its own preference and work on the shared executor, not team A's, nor A's executor.
        seen_b = _by_name((await api.call("GET", "/api/v1/executors", token=user_b)).body)
        assert set(seen_b) == {"shared-1"}
        assert seen_b["shared-1"]["preferences"] == [SHARED_PREFS[0]]
        assert [c["task_name"] for c in seen_b["shared-1"]["current"]] == ["launch-plan"]
        assert seen_b["shared-1"]["hardware"] == {}

        # Asking for another team's view is refused, not narrowed into a leak.
        assert (await api.call("GET", "/api/v1/executors?team=teamb", token=user_a)).status == 403

        # Admin: everything.
        everything = _by_name((await api.call("GET", "/api/v1/executors")).body)
        assert everything["shared-1"]["hardware"]["chip"] == SECRET_CHIP
        assert everything["shared-1"]["preferences"] == SHARED_PREFS
        assert everything["shared-1"]["details_hidden"] is False
        assert [c["task_name"] for c in everything["shared-1"]["current"]] == ["launch-plan"]

        # The other endpoints that show executors or subtasks: team B's task and its subtasks (with
        # executor names and attempt history) are not team A's to read.
        for path in ("/api/v1/tasks/teamb/secretproj/launch-plan",
                     "/api/v1/tasks/teamb/secretproj/launch-plan/subtasks"):
            reply = await api.call("GET", path, token=user_a)
            assert reply.status in (403, 404), (path, reply.status, reply.body)
        for path in ("/api/v1/tasks", "/api/v1/tasks?team=teamb"):
            listed = await api.call("GET", path, token=user_a)
            assert listed.status in (200, 403), (path, listed.status, listed.body)
            assert "launch-plan" not in jsoncodec.dumps(listed.body).decode(), (path, listed.body)
