"""The client commands against real services: submit is content-addressed and checked before it
uploads, a task no executor can serve says so, `--json --wait` is one document, `wait` reports the
task's real duration, `results | head` exits quietly, and hints name CLI flags."""

from __future__ import annotations

import hashlib
from datetime import datetime
from pathlib import Path

import aiohttp
import asyncpg

from minions import jsoncodec
from minions.testing.agents import AgentFleet
from minions.testing.waiting import eventually
from tests.cli.conftest import Cli


def _records(path: Path, count: int, ms: int = 0) -> Path:
    path.write_text("".join(f'{{"id": {i}, "ms": {ms}}}\n' for i in range(count)))
    return path


async def test_submit_is_content_addressed_and_checked_before_upload(cli: Cli) -> None:
    records = _records(cli.cwd / "records.jsonl", 5)
    command = ["submit", "records.jsonl", "--team", "search", "--project", "ranker", "--name", "s-1",
               "--kind", "sleep"]
    first = await cli.run(*command)
    assert first.returncode == 0, first.stderr
    again = await cli.run(*command)  # the same command again: the same task, not a conflict
    assert again.returncode == 0, again.stderr
    assert "submitted search/ranker/s-1" in again.stdout
    digest = hashlib.sha256(records.read_bytes()).hexdigest()
    assert [p.name for p in cli.inputs()] == [f"{digest}.jsonl"]
    status, page = await cli.get("/api/v1/tasks?team=search")
    assert status == 200 and isinstance(page, dict) and len(page["tasks"]) == 1

    # Rejected before anything is uploaded: a bad record (named by line), a bad flag, a taken name.
    bad = cli.cwd / "bad.jsonl"
    bad.write_text('{"id": 1, "ms": 1}\n{"id": 2, "ms": "soon"}\n')
    rejected = await cli.run("submit", "bad.jsonl", "--team", "search", "--project", "ranker", "--name", "s-2",
                             "--kind", "sleep")
    assert rejected.returncode == 2 and "bad.jsonl line 2: ms" in rejected.stderr, rejected.stderr
    rejected = await cli.run("submit", "records.jsonl", "--team", "no team", "--project", "ranker",
                             "--name", "s-2", "--kind", "sleep")
    assert rejected.returncode == 2 and "--team" in rejected.stderr, rejected.stderr
    _records(cli.cwd / "other.jsonl", 6)
    rejected = await cli.run("submit", "other.jsonl", "--team", "search", "--project", "ranker", "--name", "s-1",
                             "--kind", "sleep")
    assert rejected.returncode == 1 and "exists with another input" in rejected.stderr, rejected.stderr
    assert [p.name for p in cli.inputs()] == [f"{digest}.jsonl"]

    # The endpoint itself: a body that is not the named hash is refused and leaves nothing.
    async with aiohttp.ClientSession() as session:
        wrong = hashlib.sha256(b"something else").hexdigest()
        async with session.post(f"{cli.services.api_url}/api/v1/inputs", params={"sha256": wrong},
                                data=records.read_bytes(), headers={"Authorization": f"Bearer {cli.admin}",
                                                                    "Content-Type": "application/x-ndjson"}) as resp:
            assert resp.status == 422
            assert "sha256" in (await resp.json())["error"]["fields"]
        async with session.post(f"{cli.services.api_url}/api/v1/inputs", params={"sha256": digest},
                                data=records.read_bytes(), headers={"Authorization": f"Bearer {cli.admin}",
                                                                    "Content-Type": "application/x-ndjson"}) as resp:
            assert resp.status == 200  # already there
            assert (await resp.json())["uri"].endswith(f"inputs/sha256/{digest}.jsonl")
    assert [p.name for p in cli.inputs()] == [f"{digest}.jsonl"]


async def test_a_task_no_executor_serves_says_so(cli: Cli) -> None:
    (cli.cwd / "texts.jsonl").write_text('{"id": 1, "text": "hello"}\n')
    submitted = await cli.run("submit", "texts.jsonl", "--team", "search", "--project", "ranker", "--name", "e-1",
                              "--kind", "embedding", "--model", "no/such-model")
    assert submitted.returncode == 0, submitted.stderr
    assert "warning: no online executor serves embedding with model no/such-model" in submitted.stderr
    status = await cli.run("status", "search/ranker/e-1")
    assert "queued (!)" in status.stdout or "submitted (!)" in status.stdout, status.stdout
    assert "warning: no online executor serves embedding with model no/such-model" in status.stdout
    code, task = await cli.get("/api/v1/tasks/search/ranker/e-1")
    assert code == 200 and isinstance(task, dict)
    assert [w["code"] for w in task["warnings"]] == ["unservable"]

    # Results of an unfinished task: the hint names the flag, not the query string.
    results = await cli.run("results", "search/ranker/e-1")
    assert results.returncode == 1 and "--partial" in results.stderr and "?partial" not in results.stderr

    # An executor that serves the model comes online: the warning goes, and `executors` lists the model.
    async with aiohttp.ClientSession() as session, session.post(
            f"{cli.services.api_url}/api/v1/executors/register",
            headers={"Authorization": f"Bearer {cli.executor}"},
            json={"name": "gpu-box", "hardware": {"device": "cuda"}, "kinds": ["embedding"],
                  "models": ["no/such-model"], "preferences": []}) as resp:
        assert resp.status == 201

    async def served() -> bool:
        _, now = await cli.get("/api/v1/tasks/search/ranker/e-1")
        return isinstance(now, dict) and now["warnings"] == []

    await eventually(served, "the warning to go")
    executors = await cli.run("executors")
    assert "MODELS" in executors.stdout and "no/such-model" in executors.stdout, executors.stdout


async def test_wait_json_duration_and_a_closed_pipe(cli: Cli) -> None:
    fleet = AgentFleet(cli.services, cli.executor)
    fleet.start("sleepy", kinds=("sleep",))
    try:
        _records(cli.cwd / "many.jsonl", 30_000)
        waited = await cli.run("submit", "many.jsonl", "--team", "t", "--project", "p", "--name", "many",
                               "--kind", "sleep", "--subtask-size", "10000", "--json", "--wait")
        assert waited.returncode == 0, waited.stderr + fleet.logs()
        task = jsoncodec.loads(waited.stdout)  # exactly one JSON document
        assert task["status"] == "completed" and task["records"]["done"] == 30_000

        # `wait` on a finished task reports the task's duration, not how long it watched.
        _records(cli.cwd / "slow.jsonl", 4, ms=500)
        assert (await cli.run("submit", "slow.jsonl", "--team", "t", "--project", "p", "--name", "slow",
                              "--kind", "sleep", "--subtask-size", "4", "--wait")).returncode == 0
        summary = await cli.run("wait", "t/p/slow")
        _, slow = await cli.get("/api/v1/tasks/t/p/slow")
        assert isinstance(slow, dict)
        real = (datetime.fromisoformat(slow["finished_at"]) - datetime.fromisoformat(slow["started_at"]))
        assert real.total_seconds() >= 2.0
        assert f"in {real.total_seconds():.1f}s" in summary.stdout, summary.stdout

        # A reader that stops early: no complaint, no error status.
        piped = await cli.shell('$MINIONS results t/p/many | head -n 2; echo "status=${PIPESTATUS[0]}"')
        assert piped.stdout.splitlines()[:2] == ['{"id":0,"slept_ms":0}', '{"id":1,"slept_ms":0}'], piped.stdout
        assert "status=0" in piped.stdout and piped.stderr == "", piped.stderr
    finally:
        fleet.stop_all()


async def test_executors_show_trust_and_an_admin_releases_a_quarantine(cli: Cli) -> None:
    """`minions executors` shows each executor's trust, and `minions executor release`
    lifts a quarantine (sql/schema/11_checks.sql)."""
    async with aiohttp.ClientSession() as session, session.post(
            f"{cli.services.api_url}/api/v1/executors/register", headers={"Authorization": f"Bearer {cli.executor}"},
            json={"name": "suspect", "kinds": ["sleep"], "models": [],
                  "hardware": {"device": "mps", "precision": [
                      {"model": "m1", "precision": "fp16", "cosine": 0.99995, "backend": "mlx"},
                      {"model": "m2", "precision": "fp32", "cosine": 1.0}]},  # no backend: an older agent
                  "preferences": []}) as resp:
        assert resp.status == 201
        executor_id = (await resp.json())["executor_id"]
    conn = await asyncpg.connect(cli.services.database_url)
    try:
        await conn.execute("SELECT minion_quarantine_executor($1::uuid, 'outvoted in a drill')", executor_id)
    finally:
        await conn.close()
    listed = await cli.run("executors")
    assert "TRUST" in listed.stdout and "QUARANTINED" in listed.stdout and "outvoted in a drill" in listed.stdout, \
        listed.stdout
    assert "BACKEND" in listed.stdout and "mlx/fp16,torch/fp32" in listed.stdout, listed.stdout
    released = await cli.run("executor", "release", executor_id)
    assert released.returncode == 0 and "quarantine lifted" in released.stdout, released.stderr
    again = await cli.run("executor", "release", executor_id)
    assert again.returncode != 0 and "not quarantined" in again.stderr, (again.stdout, again.stderr)
    listed = await cli.run("executors")
    assert "QUARANTINED" not in listed.stdout and "checked (0 agreed, 0 outvoted)" in listed.stdout, listed.stdout
