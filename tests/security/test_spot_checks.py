"""Replicated spot checks with a quorum, and trust earned or lost.

Three executors of three API tokens, driven over HTTP against the real API and PostgreSQL: two honest
ones that write the same vectors for each record (one of a token an admin vouched for, one a
volunteer's), and a liar that writes random unit vectors of the right dimension (ids right, shape
right: the shape check at complete passes them). With every subtask checked (MINIONS_SPOT_CHECK_SHARE=1),
each volunteer's result waits for a replica by another owner, the vouched executor's wherever it can
run one; the liar's never gains a majority, so none of its vectors is committed; it loses two quorums,
is quarantined, and its next claim is 403 `quarantined` with the reason. The honest volunteer earns
trust by agreeing with the vouched executor. The task completes with the honest vectors only.

Before this change the liar's first complete committed its random vectors (no check at all), and
its claims kept being served.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from minions import jsoncodec
from minions.config import ConfigError, Settings
from minions.db.connect import connect
from minions.spot_check_settings import spot_check_session
from minions.testing.factories import make_token
from tests.support.api import ApiHarness, running_api

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
FINGERPRINT = "c" * 40
DIMS = 16
RECORDS = 8


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[ApiHarness]:
    async with running_api(database_url, tmp_path / "store", spot_check_share=1.0, trust_agreements=5,
                           quarantine_after=2, long_poll_s=1.0) as harness:
        yield harness


def honest(record_id: Any) -> list[float]:
    digest = hashlib.sha256(str(record_id).encode()).digest()
    raw = [b - 127.5 for b in digest[:DIMS]]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


def liar(_: Any) -> list[float]:
    raw = [random.gauss(0, 1) for _ in range(DIMS)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


async def register(api: ApiHarness, name: str, token: str) -> str:
    reply = await api.call("POST", "/api/v1/executors/register", token=token, json={
        "name": name, "hardware": {"os": "test", "device": "cpu"}, "kinds": ["embedding"], "models": [MODEL],
        "preferences": [], "fingerprints": [{"model": MODEL, "fingerprint": FINGERPRINT, "precision": "fp32",
                                             "backend": "test"}]})
    assert reply.status == 201, reply.body
    executor_id: str = reply.body["executor_id"]
    return executor_id


async def test_a_liar_never_commits_and_is_quarantined(api: ApiHarness, database_url: str) -> None:
    conn = await connect(database_url)
    made = [await make_token(conn, "executor") for _ in range(3)]
    tokens = [token for token, _ in made]
    await conn.execute("UPDATE api_tokens SET trusted = true WHERE id = $1", made[1][1])  # honest-a: vouched
    await conn.close()
    reply = await api.call("POST", "/api/v1/tasks", json={
        "team": "search", "project": "trust", "name": "drill", "kind": "embedding", "model": MODEL,
        "subtask_size": 1, "input": {"records": [{"id": i, "text": f"sentence {i}"} for i in range(RECORDS)]}})
    assert reply.status == 201, reply.body
    # The liar registers (and claims) first: its results are the first ones held.
    crew = [(await register(api, name, token), token, write)
            for name, token, write in (("liar", tokens[0], liar), ("honest-a", tokens[1], honest),
                                       ("honest-b", tokens[2], honest))]
    refused: dict[str, Any] = {}
    status = ""
    for _ in range(200):
        for executor_id, token, write in crew:
            if executor_id in refused:
                continue
            claimed = await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=0", token=token)
            if claimed.status == 403:
                refused[executor_id] = claimed.error
                continue
            if claimed.status != 200:
                assert claimed.status == 204, claimed.body
                continue
            lease = claimed.body
            ids = [jsoncodec.loads(line)["id"] for line in lease["subtask"]["input"]["data"].splitlines()
                   if line.strip()]
            output = b"".join(jsoncodec.dumps_line({"id": i, "embedding": write(i)}) for i in ids)
            done = await api.call("POST", f"/api/v1/leases/{lease['lease']['token']}/complete", token=token,
                                  json={"records": len(ids), "seconds": 0.01, "output": output.decode()})
            assert done.status in (200, 409), done.body  # 409: the liar's lease released by its quarantine
        status = (await api.call("GET", "/api/v1/tasks/search/trust/drill")).body["status"]
        if status == "completed" and crew[0][0] in refused:
            break
    assert status == "completed"
    liar_id = crew[0][0]
    assert refused.get(liar_id, {}).get("code") == "quarantined", refused
    assert "outvoted 2 times" in refused[liar_id]["message"]
    assert set(refused) == {liar_id}  # the honest pair is never refused

    results = await api.call("GET", "/api/v1/tasks/search/trust/drill/results")
    assert results.status == 200
    lines = [jsoncodec.loads(line) for line in results.body.splitlines() if line.strip()]
    assert len(lines) == RECORDS
    for line in lines:
        assert line["embedding"] == pytest.approx(honest(line["id"]), abs=1e-6), line["id"]

    # Shown with its trust; an admin lifts the quarantine, and it claims again (checked as new).
    listed = {e["id"]: e["trust"] for e in (await api.call("GET", "/api/v1/executors")).body["executors"]}
    assert listed[liar_id]["quarantined_at"] and "outvoted" in listed[liar_id]["quarantine_reason"]
    assert listed[liar_id]["disagreements"] == 2
    assert all(listed[e]["quarantined_at"] is None for e, _, _ in crew[1:])
    assert listed[crew[2][0]]["agreements"] > 0  # the volunteer agreed with the vouched executor
    assert [listed[e]["vouched"] for e, _, _ in crew] == [False, True, False]
    owners = [listed[e]["owner"] for e, _, _ in crew]
    assert owners == [f"token:{token_id}" for _, token_id in made]  # no owner named: each token its own
    assert (await api.call("POST", f"/api/v1/executors/{liar_id}/release", token=tokens[0])).status == 403
    assert (await api.call("POST", f"/api/v1/executors/{liar_id}/release")).status == 200
    assert (await api.call("POST", f"/api/v1/executors/{liar_id}/release")).error["code"] == "not_quarantined"
    again = await api.call("POST", f"/api/v1/executors/{liar_id}/claim?wait=0", token=tokens[0])
    assert again.status == 204, again.body

    conn = await connect(database_url)
    try:
        row = await conn.fetchrow("SELECT disagreements, quarantined_at FROM executors WHERE id = $1::uuid", liar_id)
        assert row["disagreements"] == 0 and row["quarantined_at"] is None  # released: starts again as new
        committed_by_liar = await conn.fetchval(
            "SELECT count(*) FROM subtask_attempts WHERE executor_id = $1::uuid AND outcome = 'done'", liar_id)
        assert committed_by_liar == 0
    finally:
        await conn.close()


async def test_a_completed_task_holding_a_quarantined_executors_results_warns(database_url: str,
                                                                              tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:  # no checks: the result commits
        executor_id = await register(api, "later-caught", api.executor)
        reply = await api.call("POST", "/api/v1/tasks", json={
            "team": "search", "project": "trust", "name": "before", "kind": "embedding", "model": MODEL,
            "subtask_size": 1, "input": {"records": [{"id": 1, "text": "one"}]}})
        assert reply.status == 201, reply.body
        lease = (await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=2", token="executor")).body
        output = jsoncodec.dumps_line({"id": 1, "embedding": liar(1)}).decode()
        done = await api.call("POST", f"/api/v1/leases/{lease['lease']['token']}/complete", token="executor",
                              json={"records": 1, "seconds": 0.01, "output": output})
        assert done.status == 200, done.body
        task = (await api.call("GET", "/api/v1/tasks/search/trust/before")).body
        assert task["status"] == "completed" and task["warnings"] == []
        conn = await connect(database_url)
        try:
            await conn.execute("SELECT minion_quarantine_executor($1::uuid, 'caught lying elsewhere')", executor_id)
        finally:
            await conn.close()
        task = (await api.call("GET", "/api/v1/tasks/search/trust/before")).body
        assert [w["code"] for w in task["warnings"]] == ["quarantined_results"]
        assert executor_id in task["warnings"][0]["message"] and "caught lying" in task["warnings"][0]["message"]


def test_the_api_sessions_carry_the_spot_check_settings() -> None:
    settings = Settings(spot_check_share=0.25, trust_agreements=3, quarantine_after=4,
                        spot_check_team_shares=" search = 1 , ads=0.5 ")
    assert spot_check_session(settings) == {
        "minions.spot_check_share": "0.25", "minions.trust_agreements": "3", "minions.quarantine_after": "4",
        "minions.spot_check_team_shares": "search=1,ads=0.5"}
    with pytest.raises(ConfigError, match="MINIONS_SPOT_CHECK_TEAM_SHARES"):
        Settings(spot_check_team_shares="search=2").validate()


async def _work_once(api: ApiHarness, executor_id: str, token: str, write: Any) -> int:
    """One claim (no wait) and its completes, writing `write(id)` for each record; the leases served."""
    claimed = await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=0&max=8", token=token)
    if claimed.status != 200:
        assert claimed.status in (204, 403), claimed.body
        return 0
    leases = claimed.body["leases"] if "leases" in claimed.body else [claimed.body]
    for lease in leases:
        ids = [jsoncodec.loads(line)["id"] for line in lease["subtask"]["input"]["data"].splitlines() if line.strip()]
        output = b"".join(jsoncodec.dumps_line({"id": i, "embedding": write(i)}) for i in ids)
        done = await api.call("POST", f"/api/v1/leases/{lease['lease']['token']}/complete", token=token,
                              json={"records": len(ids), "seconds": 0.01, "output": output.decode()})
        assert done.status in (200, 409), done.body
    return len(leases)


async def test_a_lone_volunteer_commits_nothing_until_honest_executors_come(api: ApiHarness,
                                                                          database_url: str) -> None:
    """A volunteer alone (no other executor online) once committed its random vectors `unchecked`.
    Now each of its results is held; past the check wait the task says so (`held_for_check`) and still
    commits nothing. A vouched executor then comes: its replicas settle the held results with its own
    vectors, the liar is quarantined, and the task completes with honest vectors only."""
    conn = await connect(database_url)
    try:
        liar_token, _ = await make_token(conn, "executor")
        honest_token, _ = await make_token(conn, "executor", trusted=True)
    finally:
        await conn.close()
    reply = await api.call("POST", "/api/v1/tasks", json={
        "team": "search", "project": "trust", "name": "alone", "kind": "embedding", "model": MODEL,
        "subtask_size": 1, "input": {"records": [{"id": i, "text": f"sentence {i}"} for i in range(RECORDS)]}})
    assert reply.status == 201, reply.body
    liar_id = await register(api, "lone-liar", liar_token)
    served = 0
    for _ in range(RECORDS):
        served += await _work_once(api, liar_id, liar_token, liar)
    assert served == RECORDS
    task = (await api.call("GET", "/api/v1/tasks/search/trust/alone")).body
    assert task["status"] == "running" and task["subtasks"]["checking"] == RECORDS
    assert task["records"]["done"] == 0
    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT minion_settle_stale_checks(0)") == RECORDS  # the watchdog's sweep
        assert await conn.fetchval("SELECT count(*) FROM subtask_attempts WHERE outcome IN ('done', 'unchecked')") == 0
    finally:
        await conn.close()
    task = (await api.call("GET", "/api/v1/tasks/search/trust/alone")).body
    assert [w["code"] for w in task["warnings"]] == ["held_for_check"]
    assert f"{RECORDS} result(s) of volunteer executors are held" in task["warnings"][0]["message"]

    honest_id = await register(api, "vouched", honest_token)
    for _ in range(4 * RECORDS):
        await _work_once(api, honest_id, honest_token, honest)
        task = (await api.call("GET", "/api/v1/tasks/search/trust/alone")).body
        if task["status"] == "completed":
            break
    assert task["status"] == "completed", task
    results = await api.call("GET", "/api/v1/tasks/search/trust/alone/results")
    lines = [jsoncodec.loads(line) for line in results.body.splitlines() if line.strip()]
    assert sorted(line["id"] for line in lines) == list(range(RECORDS))
    for line in lines:
        assert line["embedding"] == pytest.approx(honest(line["id"]), abs=1e-6), line["id"]
    listed = {e["id"]: e["trust"] for e in (await api.call("GET", "/api/v1/executors")).body["executors"]}
    assert listed[liar_id]["quarantined_at"] is not None
