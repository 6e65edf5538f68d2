"""The retention job: finished tasks older than the retention age go with their
subtasks and history, in batches; running and recent tasks stay; one run at a time; the watchdog runs
it and `minions gc --retention` runs it by hand. Their objects are then the store collector's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from minions import jsoncodec
from minions.db.connect import connect
from minions.retention import run_retention
from minions.testing.factories import make_executor, make_task, make_token
from minions.testing.processes import IMPORT_ROOT, Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually
from tests.support.tenants import tenant_tokens

COUNTS = ("SELECT (SELECT count(*) FROM subtasks WHERE task_id = $1) AS subtasks, "
          "(SELECT count(*) FROM subtask_attempts WHERE task_id = $1) AS attempts, "
          "(SELECT count(*) FROM tasks WHERE id = $1) AS task")


async def _finished(conn: Any, executor: Any, subtasks: int, days_ago: float) -> int:
    """A task whose every subtask was claimed and completed, finished `days_ago` days ago."""
    task_id = await make_task(conn, subtasks=subtasks)
    for _ in range(subtasks):
        lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", executor)
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", lease["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    # Test setup: age the task (a real one would have waited).
    await conn.execute("UPDATE tasks SET finished_at = finished_at - make_interval(secs => $2) WHERE id = $1",
                       task_id, days_ago * 86_400)
    return task_id


async def _fleet(database_url: str) -> tuple[Any, dict[str, int]]:
    conn = await connect(database_url)
    _, token_id = await make_token(conn, "executor")
    executor = await make_executor(conn, token_id)
    tasks = {"old": await _finished(conn, executor, 7, days_ago=40),
             "older": await _finished(conn, executor, 3, days_ago=50),
             "recent": await _finished(conn, executor, 4, days_ago=2)}
    # Running for 60 days: old, but not finished.
    tasks["running"] = await make_task(conn, subtasks=3)
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", executor)
    assert lease["task_id"] == tasks["running"]
    await conn.execute("UPDATE tasks SET created_at = now() - interval '60 days' WHERE id = $1", tasks["running"])
    return conn, tasks


async def test_old_finished_tasks_go_in_batches_and_the_rest_stays(database_url: str) -> None:
    conn, tasks = await _fleet(database_url)
    try:
        before = {name: dict(await conn.fetchrow(COUNTS, task_id)) for name, task_id in tasks.items()}
        seen: list[int] = []
        report = await run_retention(conn, 30, batch=3, progress=lambda r: seen.append(r.subtasks))
        assert report.ran and report.tasks == 2 and report.subtasks == 10 and report.attempts == 10
        assert (report.backlog_tasks, report.backlog_subtasks) == (2, 10)
        assert report.steps >= 4  # 7 subtasks in batches of 3, then 3: never one big delete
        assert seen[-1] == 10
        for name in ("old", "older"):
            assert dict(await conn.fetchrow(COUNTS, tasks[name])) == {"subtasks": 0, "attempts": 0, "task": 0}
        for name in ("recent", "running"):
            assert dict(await conn.fetchrow(COUNTS, tasks[name])) == before[name]
        assert await conn.fetchval("SELECT state FROM subtasks WHERE task_id = $1 AND state = 'leased'",
                                   tasks["running"]) == "leased"
        # Run again: nothing left to do.
        again = await run_retention(conn, 30)
        assert again.ran and (again.tasks, again.subtasks, again.steps) == (0, 0, 0)
    finally:
        await conn.close()


async def test_one_run_at_a_time(database_url: str) -> None:
    conn, tasks = await _fleet(database_url)
    holder = await connect(database_url)
    try:
        # Another watchdog (or an operator) is running it: this one skips rather than run it twice.
        assert await holder.fetchval("SELECT pg_try_advisory_lock(hashtext('minions.retention'))")
        skipped = await run_retention(conn, 30)
        assert not skipped.ran and skipped.tasks == 0
        assert (await conn.fetchrow(COUNTS, tasks["old"]))["task"] == 1
        # Two at once: exactly one does the work.
        await holder.fetchval("SELECT pg_advisory_unlock(hashtext('minions.retention'))")
        other = await connect(database_url)
        try:
            both = await asyncio.gather(run_retention(conn, 30, batch=1), run_retention(other, 30, batch=1))
        finally:
            await other.close()
        assert sum(r.tasks for r in both) == 2 and sum(r.subtasks for r in both) == 10
        assert all(r.tasks == 0 for r in both if not r.ran)
        # The lock is released: a later run takes it.
        assert (await run_retention(conn, 30)).ran
    finally:
        await holder.close()
        await conn.close()


def _minions(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "MINIONS_DATABASE_URL": database_url, "PYTHONPATH": str(IMPORT_ROOT), **env}
    return subprocess.run([sys.executable, "-m", "minions.cli.main", *args], env=full, cwd=IMPORT_ROOT,
                          capture_output=True, text=True, timeout=120)


async def test_gc_retention_by_hand(database_url: str) -> None:
    conn, tasks = await _fleet(database_url)
    await conn.close()
    done = await asyncio.to_thread(_minions, database_url, "gc", "--retention", "--retention-days", "45",
                                   "--batch", "2")
    assert done.returncode == 0, done.stderr
    assert "deleted 1 of 1 tasks finished over 45 days ago: 3 of 3 subtasks, 3 attempts" in done.stdout
    assert "retention:" in done.stderr  # progress
    conn = await connect(database_url)
    try:
        assert (await conn.fetchrow(COUNTS, tasks["older"]))["task"] == 0
        assert (await conn.fetchrow(COUNTS, tasks["old"]))["subtasks"] == 7
    finally:
        await conn.close()
    off = await asyncio.to_thread(_minions, database_url, "gc", "--retention", MINIONS_RETENTION_DAYS="0")
    assert off.returncode != 0 and "off" in off.stderr


def _all_exist(paths: list[Path]) -> bool:
    return all(p.exists() for p in paths)


async def _get(url: str, token: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(
            url, headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.read()


async def test_the_watchdog_runs_it_and_the_kept_tasks_objects_stay(database_url: str, tmp_path: Path) -> None:
    # Inline records as input objects (not kept in the database): the objects staying is what is tested.
    services = Services(database_url, tmp_path / "services",
                        extra_env={"MINIONS_RETENTION_DAYS": "1", "MINIONS_RETENTION_INTERVAL_S": "1",
                                   "MINIONS_INPUT_IN_DATABASE_BYTES": "0"})
    await services.start_all()
    tokens = await tenant_tokens(database_url)
    api, store = services.api_url, services.store_root
    stop = asyncio.Event()
    runner = asyncio.create_task(SleepExecutor(api, tokens["executor"], "retention-ex").run(stop))
    conn = await connect(database_url)
    try:
        for name in ("expired", "kept"):
            async with aiohttp.ClientSession() as session, session.post(
                    f"{api}/api/v1/tasks", headers={"Authorization": f"Bearer {tokens['alpha']}"},
                    json={"team": "alpha", "project": "p", "name": name, "kind": "sleep", "subtask_size": 2,
                          "input": {"records": [{"id": f"{name}-{i}", "ms": 1} for i in range(4)]}}) as resp:
                assert resp.status == 201, await resp.text()

            async def completed(name: str = name) -> Any:
                _, body = await _get(f"{api}/api/v1/tasks/alpha/p/{name}", tokens["alpha"])
                return True if jsoncodec.loads(body)["status"] == "completed" else None

            await eventually(completed, f"{name} to complete")
        kept_id = await conn.fetchval("SELECT id FROM tasks WHERE name = 'kept'")
        kept_input = Path((await conn.fetchval("SELECT input_uri FROM tasks WHERE id = $1", kept_id))
                          .removeprefix("file://"))
        kept_results = sorted((store / "results" / str(kept_id)).rglob("*.jsonl"))
        assert len(kept_results) == 2 and _all_exist([kept_input])
        await conn.execute("UPDATE tasks SET finished_at = now() - interval '2 days' WHERE name = 'expired'")

        async def expired_gone() -> bool | None:
            status, _ = await _get(f"{api}/api/v1/tasks/alpha/p/expired", tokens["alpha"])
            return True if status == 404 else None

        await eventually(expired_gone, "the watchdog's retention job to delete the expired task", timeout_s=60)
        assert "retention_done" in services.running["watchdog"].log()
        status, results = await _get(f"{api}/api/v1/tasks/alpha/p/kept/results", tokens["alpha"])
        assert status == 200 and results.count(b"\n") == 4
        assert _all_exist([kept_input, *kept_results])
        assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1", kept_id) == 2
    finally:
        await conn.close()
        stop.set()
        await asyncio.gather(runner, return_exceptions=True)
        services.stop_all()
