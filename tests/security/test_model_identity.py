"""Model identity pinned per task. An executor reports, per model, a fingerprint of
what it loaded (docs/API.md, register); a task's fingerprint is fixed at submission (`model@revision`)
or by its first lease (sql/schema/06_leases.sql), and from then on only executors of that fingerprint lease its
subtasks, so a task never mixes models. An executor that reports none (an older agent) is its own
fingerprint, 'unknown:<executor id>', and shown as such. Each attempt records the fingerprint and
precision it ran with (GET .../subtasks).

Before this change every claim here leased to both executors (the task mixed both models), the
register body refused `fingerprints` as nothing (it was ignored), a task had no `fingerprint` and
`m@rev` was a model name no executor served."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token
from tests.support.api import ApiHarness, running_api

FP_A = "a" * 40  # a Hugging Face commit
FP_B = "sha256:" + "b" * 64  # a SHA-256 over a model folder


async def _executor(conn: asyncpg.Connection, token_id: int, fingerprint: str | None,
                    name: str | None = None, **kwargs: Any) -> uuid.UUID:
    ex = await make_executor(conn, token_id, name=name, kinds=("embedding",), models=("m",), **kwargs)
    if fingerprint is not None:
        await conn.execute("SELECT minion_set_executor_fingerprints($1, $2::jsonb)", ex,
                           [{"model": "m", "fingerprint": fingerprint, "precision": "fp32", "backend": "test"}])
    return ex


async def _claim(conn: asyncpg.Connection, ex: uuid.UUID, token_id: int, n: int = 1) -> list[asyncpg.Record]:
    rows = await conn.fetch("SELECT * FROM minion_claim_batch($1, $2, $3)", ex, token_id, n)
    return [r for r in rows if r["verdict"] == "leased"]


async def _setup(database_url: str) -> tuple[asyncpg.Connection, int]:
    """A connection and a vouched executor token: only a vouched executor's lease pins a task."""
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor", trusted=True)
    return conn, token_id


async def test_the_first_lease_pins_the_task_and_the_other_fingerprint_gets_none(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task = await make_task(conn, kind="embedding", model="m", subtasks=6)
    a = await _executor(conn, token_id, FP_A)
    b = await _executor(conn, token_id, FP_B)
    first = await _claim(conn, a, token_id)
    assert [r["task_id"] for r in first] == [task]
    assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task) == FP_A
    assert await _claim(conn, b, token_id, 10) == []  # batched claim
    assert await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", b) is None  # single claim
    # B's own task (pinned to B by its first lease) is B's alone.
    other = await make_task(conn, kind="embedding", model="m", subtasks=2)
    assert {r["task_id"] for r in await _claim(conn, b, token_id, 10)} == {other}
    rest = await _claim(conn, a, token_id, 10)
    assert sorted(r["subtask_id"] for r in rest) == [1, 2, 3, 4, 5]
    for lease in first + rest:
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", lease["lease_token"]) == "ok"
    attempts = await conn.fetch(
        """SELECT a.executor_id, m.fingerprint, m.precision FROM subtask_attempts a
             CROSS JOIN LATERAL minion_attempt_model(a.executor_id, 'embedding:m', a.started_at) m
            WHERE a.task_id = $1""", task)
    assert len(attempts) == 6 and {tuple(r) for r in attempts} == {(a, FP_A, "fp32")}
    await conn.close()


async def test_a_preferred_task_and_a_straggler_backup_keep_the_pin(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task = await make_task(conn, kind="embedding", model="m", name="wanted", subtasks=4)
    a = await _executor(conn, token_id, FP_A)
    prefs = [{"team": "search", "project": "ranker", "task_name": "wanted"}]
    b = await _executor(conn, token_id, FP_B, preferences=prefs)
    b_project = await _executor(conn, token_id, FP_B, preferences=[{"team": "search", "project": "ranker"}])
    leases = await _claim(conn, a, token_id, 3)
    assert len(leases) == 3
    assert await _claim(conn, b, token_id, 10) == []
    assert await _claim(conn, b_project, token_id, 10) == []
    for lease in leases:
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", lease["lease_token"]) == "ok"
    straggler = await _claim(conn, a, token_id)
    await conn.execute("UPDATE subtasks SET leased_at = now() - interval '1 hour' WHERE task_id = $1 AND "
                       "state = 'leased'", task)
    assert await conn.fetchval("SELECT minion_claim_backup($1, '{embedding:m}', NULL, 2)", b) is None
    a2 = await _executor(conn, token_id, FP_A)
    assert await conn.fetchval("SELECT minion_claim_backup($1, '{embedding:m}', NULL, 2)", a2) is not None
    assert straggler
    await conn.close()


async def test_an_executor_without_fingerprint_pins_nothing(database_url: str) -> None:
    """An older agent, or one that has not loaded the model yet (no fingerprint: 'unknown:<id>'), takes
    only tasks no one pinned and leaves them unpinned (minion_claim_pin_tasks): pinning the task to
    'unknown:<id>' would make the task run on that one machine and wait forever once it was gone. It never
    joins a task pinned to a reported fingerprint, and its attempts read as unknown."""
    conn, token_id = await _setup(database_url)
    old = await _executor(conn, token_id, None)
    old_twin = await _executor(conn, token_id, None)
    a = await _executor(conn, token_id, FP_A)
    pinned = await make_task(conn, kind="embedding", model="m", subtasks=2)
    assert len(await _claim(conn, a, token_id)) == 1
    assert await _claim(conn, old, token_id, 10) == []
    task = await make_task(conn, kind="embedding", model="m", subtasks=4)
    leases = await _claim(conn, old, token_id)
    assert [r["task_id"] for r in leases] == [task]
    assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task) is None
    assert [r["task_id"] for r in await _claim(conn, old_twin, token_id)] == [task]  # still open to all
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", leases[0]["lease_token"]) == "ok"
    model = await conn.fetchrow(
        """SELECT m.fingerprint FROM subtask_attempts a
             CROSS JOIN LATERAL minion_attempt_model(a.executor_id, 'embedding:m', a.started_at) m
            WHERE a.task_id = $1 AND a.executor_id = $2""", task, old)
    assert model["fingerprint"] == f"unknown:{old}"
    # The first executor that reports one pins it; the unknown ones get no more of it.
    assert {r["task_id"] for r in await _claim(conn, a, token_id, 10)} == {pinned, task}
    assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task) == FP_A
    assert await _claim(conn, old, token_id, 10) == []
    await conn.close()


async def test_a_volunteers_fingerprint_pins_nothing(database_url: str) -> None:
    """A volunteer that reports a made-up fingerprint and claims a task's first lease (the
    task was pinned to it and 300 random vectors committed unchecked) leaves the task unpinned; the
    vouched executor's first lease pins it to its own fingerprint, and the volunteer gets no more of it."""
    conn, vouched_token = await _setup(database_url)
    _, volunteer_token = await make_token(conn, "executor")
    made_up = "sha256:" + "0" * 56 + "deadbeef"
    hostile = await _executor(conn, volunteer_token, made_up)
    honest = await _executor(conn, vouched_token, FP_A)
    task = await make_task(conn, kind="embedding", model="m", subtasks=4)
    assert [r["task_id"] for r in await _claim(conn, hostile, volunteer_token)] == [task]
    assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task) is None
    assert {r["task_id"] for r in await _claim(conn, honest, vouched_token, 2)} == {task}
    assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task) == FP_A
    assert await _claim(conn, hostile, volunteer_token, 10) == []
    await conn.close()


async def test_a_pin_that_holds_nothing_is_given_back(database_url: str) -> None:
    """A machine pins a task with its first lease and vanishes (or a hostile executor claims one
    subtask of every new task and goes silent): once the task holds nothing from it (its lease
    reclaimed, no subtask done), the watchdog's sweep gives the pin back and another fingerprint
    runs the task. A task with a result, or pinned by its submission, keeps its pin."""
    conn, token_id = await _setup(database_url)
    a = await _executor(conn, token_id, FP_A)
    b = await _executor(conn, token_id, FP_B)
    stranded = await make_task(conn, kind="embedding", model="m", name="stranded", subtasks=1)
    kept = await make_task(conn, kind="embedding", model="m", name="kept", subtasks=2)
    revision = await make_task(conn, kind="embedding", model=f"m@{FP_A}", name="revision", subtasks=2)
    leases = await _claim(conn, a, token_id, 3)
    assert {r["task_id"] for r in leases} == {stranded, kept}
    done = next(r for r in leases if r["task_id"] == kept)
    assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", done["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT minion_unpin_idle_tasks()") == 0  # A still holds leases of both
    assert await _claim(conn, b, token_id, 10) == []
    # A goes silent: the watchdog takes its leases back.
    await conn.execute("UPDATE heartbeats SET beat_at = now() - interval '1 hour', seen_at = now() - interval "
                       "'1 hour' WHERE executor_id = $1", a)
    assert await conn.fetchval("SELECT minion_reclaim_executor($1)", a) == 2
    assert await conn.fetchval("SELECT minion_unpin_idle_tasks()") == 1
    fingerprints = dict(await conn.fetch("SELECT name, fingerprint FROM tasks WHERE id = ANY($1)",
                                         [stranded, kept, revision]))
    assert fingerprints == {"stranded": None, "kept": FP_A, "revision": FP_A}
    taken = await _claim(conn, b, token_id, 10)
    assert {r["task_id"] for r in taken} == {stranded}
    assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", stranded) == FP_B
    assert await conn.fetchval("SELECT minion_unpin_idle_tasks()") == 0  # B holds its leases
    await conn.close()


async def test_sleep_tasks_are_never_pinned(database_url: str) -> None:
    conn, token_id = await _setup(database_url)
    task = await make_task(conn, subtasks=4)
    one, two = (await make_executor(conn, token_id), await make_executor(conn, token_id))
    assert len(await _claim(conn, one, token_id, 2)) == 2 and len(await _claim(conn, two, token_id, 2)) == 2
    assert await conn.fetchval("SELECT fingerprint FROM tasks WHERE id = $1", task) is None
    await conn.close()


async def test_two_fingerprints_racing_for_the_first_lease_never_both_win(database_url: str) -> None:
    """A's claim pins the task and is still open; B's claim, at the same instant, read the task
    unpinned and locked other subtasks of it. B's pin waits for A's row lock, then finds the task
    pinned to A: B takes none of it (and nothing else is pending, so nothing at all)."""
    conn, token_id = await _setup(database_url)
    task = await make_task(conn, kind="embedding", model="m", subtasks=8)
    a = await _executor(conn, token_id, FP_A)
    b = await _executor(conn, token_id, FP_B)
    conn_a, conn_b = await connect(database_url), await connect(database_url)
    try:
        tx_a = conn_a.transaction()
        await tx_a.start()
        won_a = await _claim(conn_a, a, token_id, 2)
        assert len(won_a) == 2
        claim_b = asyncio.create_task(_claim(conn_b, b, token_id, 3))

        async def waiting_on_a_lock() -> bool:
            return bool(await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = $1",
                conn_b.get_server_pid()))

        for _ in range(100):
            if await waiting_on_a_lock():
                break
            await asyncio.sleep(0.05)
        assert await waiting_on_a_lock(), "B's claim should wait on A's pin of the task row"
        await tx_a.commit()
        won_b = await asyncio.wait_for(claim_b, 10)
        assert won_b == []
        holders = await conn.fetch("SELECT DISTINCT lease_executor FROM subtasks WHERE task_id = $1 "
                                   "AND state = 'leased'", task)
        assert [r["lease_executor"] for r in holders] == [a]
        assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND state = 'pending'",
                                   task) == 6
        # B locked three rows and took none: all six are A's to claim now.
        assert len(await _claim(conn, a, token_id, 10)) == 6
    finally:
        await conn_a.close()
        await conn_b.close()
        await conn.close()


async def _register(api: ApiHarness, name: str, fingerprints: Any, models: list[str] | None = None) -> Any:
    return await api.call("POST", "/api/v1/executors/register", token="executor", json={
        "name": name, "kinds": ["embedding"], "models": models or ["m"], "fingerprints": fingerprints})


async def test_the_api_takes_fingerprints_pins_model_at_revision_and_shows_each_attempt(
        database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        bad = await _register(api, "bad", [{"model": "other", "fingerprint": "x y"}, "no", {"model": "m",
                              "fingerprint": FP_A, "precision": "fp 16", "extra": 1}])
        assert bad.status == 422, bad.body
        assert set(bad.error["fields"]) == {"fingerprints[0].model", "fingerprints[0].fingerprint",
                                            "fingerprints[1]", "fingerprints[2].precision"}
        twice = await _register(api, "twice", [{"model": "m", "fingerprint": FP_A},
                                               {"model": "m", "fingerprint": FP_B}])
        assert set(twice.error["fields"]) == {"fingerprints[1].model"}, twice.body
        reply = await _register(api, "a", [{"model": "m", "fingerprint": FP_A.upper(), "precision": "bf16",
                                            "backend": "transformers"}])
        assert reply.status == 201, reply.body
        a = reply.body["executor_id"]
        reply = await _register(api, "b", [{"model": "m", "fingerprint": FP_B, "precision": "fp32"}])
        b = reply.body["executor_id"]
        old = await api.call("POST", "/api/v1/executors/register", token="executor", json={
            "name": "old", "kinds": ["embedding"], "models": ["m"]})  # an agent from before fingerprints
        assert old.status == 201, old.body
        listed = {e["name"]: e["fingerprints"] for e in (await api.call("GET", "/api/v1/executors")).body["executors"]}
        assert listed == {"a": [{"model": "m", "fingerprint": FP_A, "precision": "bf16", "backend": "transformers",
                                 "proofs": None}],
                          "b": [{"model": "m", "fingerprint": FP_B, "precision": "fp32", "backend": None,
                                 "proofs": None}],
                          "old": []}
        await api.call("POST", f"/api/v1/executors/{old.body['executor_id']}/deregister", token="executor")

        bad_rev = await api.call("POST", "/api/v1/tasks", json={
            "team": "search", "project": "ranker", "name": "bad-rev", "kind": "embedding", "model": "m@no way",
            "input": {"records": [{"id": 1, "text": "x"}]}})
        assert bad_rev.status == 422 and "name@revision" in bad_rev.error["fields"]["model"], bad_rev.body
        submitted = await api.call("POST", "/api/v1/tasks", json={
            "team": "search", "project": "ranker", "name": "pinned", "kind": "embedding", "model": f"m@{FP_B}",
            "subtask_size": 1, "input": {"records": [{"id": i, "text": "x"} for i in range(3)]}})
        assert submitted.status in (200, 201, 202), submitted.body
        assert submitted.body["model"] == "m" and submitted.body["fingerprint"] == FP_B
        assert submitted.body["warnings"] == []  # m@rev is served as m

        empty = await api.call("POST", f"/api/v1/executors/{a}/claim?wait=0&max=5", token="executor")
        assert empty.status == 204, empty.body
        got = await api.call("POST", f"/api/v1/executors/{b}/claim?wait=0&max=5", token="executor")
        assert got.status == 200, got.body
        subtasks = await api.call("GET", "/api/v1/tasks/search/ranker/pinned/subtasks")
        running = [h for s in subtasks.body["subtasks"] for h in s["history"]]
        assert len(running) == 3
        assert {(h["executor"], h["fingerprint"], h["precision"], h["outcome"]) for h in running} == {
            ("b", FP_B, "fp32", "running")}

        # Registering again replaces the fingerprints (here: the same agent, another revision). It ends
        # b's leases, which are recorded with the fingerprint they ran with.
        reply = await _register(api, "b", [{"model": "m", "fingerprint": FP_A}])
        subtasks = await api.call("GET", "/api/v1/tasks/search/ranker/pinned/subtasks")
        ended = [h for s in subtasks.body["subtasks"] for h in s["history"]]
        assert {(h["fingerprint"], h["outcome"]) for h in ended} == {(FP_B, "lost")}
        again = await api.call("POST", f"/api/v1/executors/{b}/claim?wait=0&max=5", token="executor")
        assert again.status == 204, again.body
        task = await api.call("GET", "/api/v1/tasks/search/ranker/pinned")
        assert task.body["fingerprint"] == FP_B and task.body["subtasks"]["pending"] == 3


async def test_the_fingerprint_history_stays_bounded(database_url: str) -> None:
    """Registering the same name again is not rate-limited: the same fingerprints add no history,
    and an executor keeps its latest 64 periods whatever it sends."""
    conn, token_id = await _setup(database_url)
    ex = await _executor(conn, token_id, FP_A)
    periods = "SELECT count(DISTINCT valid_from) FROM executor_fingerprint_history WHERE executor_id = $1"
    for _ in range(5):
        await conn.execute("SELECT minion_set_executor_fingerprints($1, $2::jsonb)", ex,
                           [{"model": "m", "fingerprint": FP_A, "precision": "fp32", "backend": "test"}])
    assert await conn.fetchval(periods, ex) == 1
    for i in range(70):
        await conn.execute("SELECT minion_set_executor_fingerprints($1, $2::jsonb)", ex,
                           [{"model": "m", "fingerprint": f"{i:040x}"}])
    assert await conn.fetchval(periods, ex) == 64
    assert await conn.fetchval("SELECT fingerprint FROM executor_fingerprints WHERE executor_id = $1", ex) \
        == f"{69:040x}"
    await conn.close()
