"""A model pin no online executor reports any more (minion_release_orphan_pins, sql/schema/06_leases.sql):
a task pinned by a vouched executor's first lease, whose machine then went away, is released while work
waits; the results volunteers committed under the pin run again, the vouched ones are kept, and the task
says so. A pin an online vouched executor still reports, or one the submission named (`name@revision`),
stays; a volunteer's report keeps none."""

from __future__ import annotations

import datetime
import uuid

import asyncpg

from minions.db.connect import connect
from minions.services.api.tasks.representations import task_warnings
from minions.testing.factories import make_executor, make_task, make_token, silence

CLAIM = "SELECT * FROM minion_claim_batch($1, NULL, 1) WHERE verdict = 'leased'"
COMPLETE = "SELECT minion_complete($1, 1, 0.01, NULL, NULL, NULL, NULL)"
MODEL = "m"
FINGERPRINT = "f" * 40


async def _executor(conn: asyncpg.Connection, name: str, *, vouched: bool) -> uuid.UUID:
    _, token_id = await make_token(conn, "executor", trusted=vouched)
    executor = await make_executor(conn, token_id, name=name, kinds=("embedding",), models=(MODEL,))
    entry = {"model": MODEL, "fingerprint": FINGERPRINT, "precision": "fp32", "backend": "test"}
    await conn.execute("SELECT minion_set_executor_fingerprints($1, $2::jsonb)", executor, [entry])
    return executor


async def test_an_orphan_pin_is_released_and_its_volunteers_results_run_again(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        task_id = await make_task(conn, kind="embedding", model=MODEL, subtasks=3)
        vouched = await _executor(conn, "vouched", vouched=True)
        volunteer = await _executor(conn, "volunteer", vouched=False)
        for executor in (vouched, volunteer):  # checks off: both commit
            lease = await conn.fetchrow(CLAIM, executor)
            assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
        assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task_id) == FINGERPRINT
        assert await conn.fetchval("SELECT minion_release_orphan_pins(600)") == 0  # both online
        await silence(conn, vouched, 3600)
        # The volunteer still online reports the fingerprint: a volunteer's report keeps no pin (it made
        # none, and one alone would strand the task, its results held for a check nobody can run).
        assert await conn.fetchval("SELECT minion_release_orphan_pins(600)") == 1
        row = await conn.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
        assert row["fingerprint"] is None and row["pin_released_fingerprint"] == FINGERPRINT
        states = dict(await conn.fetch("SELECT subtask_id, state FROM subtasks WHERE task_id = $1", task_id))
        assert sorted(states.values()) == ["done", "pending", "pending"]
        outcomes = dict(await conn.fetch("SELECT executor_id, outcome FROM subtask_attempts WHERE task_id = $1",
                                         task_id))
        assert outcomes == {vouched: "done", volunteer: "revoked"}
        counts = await conn.fetchrow("SELECT * FROM minion_task_counts($1)", task_id)
        assert (counts["subtasks_done"], counts["subtasks_pending"], counts["records_done"]) == (1, 2, 1)
        assert await conn.fetchval("SELECT minion_release_orphan_pins(600)") == 0  # nothing pinned now
        [warning] = task_warnings({**dict(row), "finished_at": None, "servable": True})
        assert warning["code"] == "pin_released" and FINGERPRINT in warning["message"]
    finally:
        await conn.close()


async def test_a_pin_the_submission_named_is_never_released(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        task_id = await make_task(conn, kind="embedding", model=MODEL, subtasks=2)
        await conn.execute("UPDATE tasks SET fingerprint = $2, fingerprint_from_revision = true WHERE id = $1",
                           task_id, FINGERPRINT)
        assert await conn.fetchval("SELECT minion_release_orphan_pins(600)") == 0
        assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task_id) == FINGERPRINT
        assert task_warnings({"finished_at": None, "servable": True, "pin_released_at": None}) == []
        assert task_warnings({"finished_at": None, "servable": True,
                              "pin_released_at": datetime.datetime.now(datetime.UTC),
                              "pin_released_fingerprint": "x"})[0]["code"] == "pin_released"
    finally:
        await conn.close()
