"""`minions verify TASK` against real services: a task completed with a liar's vectors (no spot check
ran: share 0), the liar quarantined afterwards; verify re-runs the liar's subtasks on an honest
executor, as a task of their own pinned to the same fingerprint, and lists every record whose vector
changed (exit 1). A task with nothing suspect says so (exit 0); an open task is refused."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import aiohttp
import asyncpg

from minions import jsoncodec
from minions.testing.factories import make_token
from minions.testing.waiting import eventually
from tests.cli.conftest import Cli
from tests.e2e.test_spot_checks_drill import Liar, random_vectors, running

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
FINGERPRINT = {"model": MODEL, "fingerprint": "d" * 40, "precision": "fp32", "backend": "test"}


def honest_vectors(_lease: int, records: list[dict[str, Any]]) -> list[list[float]]:
    out = []
    for record in records:
        raw = [b - 127.5 for b in hashlib.sha256(str(record["id"]).encode()).digest()[:16]]
        norm = math.sqrt(sum(x * x for x in raw))
        out.append([x / norm for x in raw])
    return out


async def _post(cli: Cli, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            cli.services.api_url + path, headers={"Authorization": f"Bearer {cli.admin}"}, json=body) as resp:
        return resp.status, jsoncodec.loads(await resp.read())


async def test_verify_reruns_a_quarantined_executors_results_and_lists_what_changed(cli: Cli) -> None:
    conn = await asyncpg.connect(cli.services.database_url)
    try:
        # Both vouched for (their first leases pin the tasks to their fingerprint); one turns out to lie.
        liar_token, _ = await make_token(conn, "executor", trusted=True)
        honest_token, _ = await make_token(conn, "executor", trusted=True)
        liar = Liar(cli.services.api_url, liar_token, FINGERPRINT, random_vectors, name="liar")
        async with running(liar):
            status, _ = await _post(cli, "/api/v1/tasks", {
                "team": "search", "project": "ranker", "name": "suspect", "kind": "embedding", "model": MODEL,
                "subtask_size": 2, "input": {"records": [{"id": i, "text": f"sentence {i}"} for i in range(6)]}})
            assert status == 201

            async def completed() -> bool:
                return await conn.fetchval("SELECT status FROM tasks WHERE name = 'suspect'") == "completed"

            await eventually(completed, "the liar to complete the task", timeout_s=60)
        # Open tasks are refused: their results are checked as they run.
        status, _ = await _post(cli, "/api/v1/tasks", {
            "team": "search", "project": "ranker", "name": "open", "kind": "sleep",
            "input": {"records": [{"id": 1, "ms": 0}]}})
        assert status == 201
        refused = await cli.run("verify", "search/ranker/open")
        assert refused.returncode == 1 and "results of an open task are checked as it runs" in refused.stderr, \
            refused.stderr
        # Nothing suspect yet.
        nothing = await cli.run("verify", "search/ranker/suspect")
        assert nothing.returncode == 0 and "nothing to verify" in nothing.stdout, (nothing.stdout, nothing.stderr)

        await conn.execute("SELECT minion_quarantine_executor(id, 'outvoted in a drill') FROM executors"
                           " WHERE name = 'liar'")
        honest = Liar(cli.services.api_url, honest_token, FINGERPRINT, honest_vectors, name="honest")
        async with running(honest):
            checked = await cli.run("verify", "search/ranker/suspect")
        assert checked.returncode == 1, (checked.stdout, checked.stderr)
        assert "6 record(s) re-run, 0 agree, 6 differ (below cosine 0.999)" in checked.stdout, checked.stdout
        assert "COSINE" in checked.stdout
        # The verification task is a task like any, pinned to the same fingerprint, run by the honest one.
        row = await conn.fetchrow("SELECT name, fingerprint, status FROM tasks WHERE name LIKE 'suspect-verify-%'")
        assert row["fingerprint"] == "d" * 40 and row["status"] == "completed", row
        runners = await conn.fetch("""SELECT DISTINCT e.name FROM subtask_attempts a JOIN executors e
                                        ON e.id = a.executor_id JOIN tasks t ON t.id = a.task_id
                                       WHERE t.name = $1""", row["name"])
        assert [r["name"] for r in runners] == ["honest"]
    finally:
        await conn.close()
