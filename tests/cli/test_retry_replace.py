"""Recovering from a failed task through real services: `minions retry` runs its failed subtasks
again (a real agent completes them) and refuses what is not failed; `submit --replace` puts a
changed definition under the old name with none of the old task's results; the 409 of a taken name
says what to do."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.agents import AgentFleet
from minions.testing.factories import make_executor, make_token
from tests.cli.conftest import Cli


def _records(cli: Cli, name: str, ids: range) -> None:
    (cli.cwd / name).write_text("".join(f'{{"id": {i}, "ms": 1}}\n' for i in ids))


async def _fail_everything(database_url: str, task: str) -> None:
    """Every subtask of the task failed for good, as an executor would fail them (not retryable)."""
    team, project, name = task.split("/")
    conn = await connect(database_url)
    try:
        _, token_id = await make_token(conn, "executor")
        executor = await make_executor(conn, token_id)
        subtasks = await conn.fetchval("SELECT subtasks_total FROM tasks WHERE team = $1 AND project = $2 "
                                       "AND name = $3", team, project, name)
        assert subtasks > 0
        for _ in range(subtasks):
            lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", executor)
            assert lease is not None and lease["task_name"] == name
            assert await conn.fetchval("SELECT minion_fail($1, 'disk full', false)", lease["lease_token"]) == "ok"
        await conn.execute("SELECT minion_deregister($1)", executor)
    finally:
        await conn.close()


async def test_retry_runs_the_failed_subtasks_again_through_real_services(cli: Cli, database_url: str) -> None:
    _records(cli, "r.jsonl", range(3))
    assert (await cli.run("submit", "r.jsonl", "--team", "search", "--project", "ranker", "--name", "r-1",
                          "--kind", "sleep", "--subtask-size", "1")).returncode == 0
    code, task = await cli.get("/api/v1/tasks/search/ranker/r-1")
    assert code == 200 and isinstance(task, dict)
    not_yet = await cli.run("retry", "search/ranker/r-1")  # not failed (yet): refused, with the reason
    assert not_yet.returncode == 1 and "task_not_failed" in not_yet.stderr, not_yet.stderr
    assert "only a failed task can be retried" in not_yet.stderr

    await _fail_everything(database_url, "search/ranker/r-1")
    failed = await cli.run("status", "search/ranker/r-1", "--json")
    assert jsoncodec.loads(failed.stdout)["status"] == "failed"

    fleet = AgentFleet(cli.services, cli.executor)
    fleet.start("retrier", kinds=("sleep",))
    try:
        retried = await cli.run("retry", "search/ranker/r-1", "--wait")
        assert retried.returncode == 0, retried.stderr + retried.stdout + fleet.logs()
        assert "search/ranker/r-1: running again; 3 failed subtask(s) back in the queue" in retried.stdout
        assert "completed: 3/3 records" in retried.stdout, retried.stdout
    finally:
        fleet.stop_all()
    results = await cli.run("results", "search/ranker/r-1")
    lines = [jsoncodec.loads(line) for line in results.stdout.splitlines()]
    assert [r["id"] for r in lines] == [0, 1, 2] and not any("error" in r for r in lines), results.stdout

    again = await cli.run("retry", "search/ranker/r-1")
    assert again.returncode == 1 and "search/ranker/r-1 is completed" in again.stderr, again.stderr
    unknown = await cli.run("retry", "search/ranker/nope")
    assert unknown.returncode == 1 and "404" in unknown.stderr, unknown.stderr


async def test_replace_puts_a_changed_definition_under_the_name_without_the_old_results(cli: Cli,
                                                                                       database_url: str) -> None:
    _records(cli, "old.jsonl", range(2))
    assert (await cli.run("submit", "old.jsonl", "--team", "search", "--project", "ranker", "--name", "p-1",
                          "--kind", "sleep")).returncode == 0
    await _fail_everything(database_url, "search/ranker/p-1")

    _records(cli, "new.jsonl", range(10, 13))
    taken = await cli.run("submit", "new.jsonl", "--team", "search", "--project", "ranker", "--name", "p-1",
                          "--kind", "sleep")
    assert taken.returncode == 1
    assert "--replace" in taken.stderr and "minions retry search/ranker/p-1" in taken.stderr, taken.stderr
    # The same input with another definition: the server's 409 says the same.
    taken = await cli.run("submit", "old.jsonl", "--team", "search", "--project", "ranker", "--name", "p-1",
                          "--kind", "sleep", "--priority", "5")
    assert taken.returncode == 1 and "task_exists" in taken.stderr and "--replace" in taken.stderr, taken.stderr

    fleet = AgentFleet(cli.services, cli.executor)
    fleet.start("replacer", kinds=("sleep",))
    try:
        replaced = await cli.run("submit", "new.jsonl", "--team", "search", "--project", "ranker", "--name", "p-1",
                                 "--kind", "sleep", "--replace", "--wait")
        assert replaced.returncode == 0, replaced.stderr + fleet.logs()
        assert "replacing search/ranker/p-1: the old task (failed" in replaced.stderr, replaced.stderr
    finally:
        fleet.stop_all()
    results = await cli.run("results", "search/ranker/p-1")
    assert [jsoncodec.loads(line)["id"] for line in results.stdout.splitlines()] == [10, 11, 12], results.stdout
    code, page = await cli.get("/api/v1/tasks?team=search")
    assert code == 200 and isinstance(page, dict) and [t["name"] for t in page["tasks"]] == ["p-1"]


async def test_replace_cancels_a_task_that_runs_then_takes_its_name(cli: Cli) -> None:
    _records(cli, "a.jsonl", range(2))
    first = await cli.run("submit", "a.jsonl", "--team", "search", "--project", "ranker", "--name", "q-1",
                          "--kind", "sleep", "--json")  # no executor: it stays queued
    assert first.returncode == 0, first.stderr
    _records(cli, "b.jsonl", range(5))
    replaced = await cli.run("submit", "b.jsonl", "--team", "search", "--project", "ranker", "--name", "q-1",
                             "--kind", "sleep", "--replace", "--json")
    assert replaced.returncode == 0, replaced.stderr
    task = jsoncodec.loads(replaced.stdout)
    assert task["status"] in ("submitted", "queued") and task["records"]["total"] in (0, 5)
    code, shown = await cli.get("/api/v1/tasks/search/ranker/q-1")
    assert code == 200 and isinstance(shown, dict)
    assert shown["created_at"] == task["created_at"] != jsoncodec.loads(first.stdout)["created_at"]
    assert shown["input_uri"] != jsoncodec.loads(first.stdout)["input_uri"]


async def test_replace_with_a_body_the_server_refuses_leaves_the_old_task(cli: Cli, database_url: str) -> None:
    """`submit --replace` asks the server to judge the new body (`?dry_run=true`) before it deletes the
    old task: a user's priority above the team's cap is a 403 that used to leave nothing."""
    conn = await connect(database_url)
    try:
        user, _ = await make_token(conn, "user", "search")
    finally:
        await conn.close()
    _records(cli, "keep.jsonl", range(2))
    first = await cli.run("submit", "keep.jsonl", "--team", "search", "--project", "ranker", "--name", "k-1",
                          "--kind", "sleep", "--json")
    assert first.returncode == 0, first.stderr
    _records(cli, "over.jsonl", range(4))
    env = {**cli.env(), "MINIONS_TOKEN": user}
    refused = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "minions.cli.main", "submit", "over.jsonl", "--team", "search",
                         "--project", "ranker", "--name", "k-1", "--kind", "sleep", "--priority", "5", "--replace"],
        cwd=cli.cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 1 and "priority_above_cap" in refused.stderr, refused.stderr
    code, kept = await cli.get("/api/v1/tasks/search/ranker/k-1")
    assert code == 200 and isinstance(kept, dict)
    assert kept["created_at"] == jsoncodec.loads(first.stdout)["created_at"]  # the old task, untouched
