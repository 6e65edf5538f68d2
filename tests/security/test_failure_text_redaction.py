"""What an executor writes about a failure leaks no secret, whichever lease it names.

An executor holds three leases of one task. It fails the first with a text that names the other two
leases' tokens (one as written, one as 32 upper-case hex digits), an admin token and another lease's
signed output URL; it completes the second with an output whose record carries an `error` field
holding the first lease's token, the admin token and a signed URL; the third completes cleanly.
None of those secrets is in the task's `error`, `/subtasks`, the results, or the API's log (real
services, real PostgreSQL).
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp

from minions import jsoncodec
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually

TASK = "/api/v1/tasks/search/ranker/leaky"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _claim(session: aiohttp.ClientSession, executor: SleepExecutor) -> dict[str, Any]:
    lease = await executor.claim(session, wait_s=30)  # answers as soon as a subtask is pending
    assert lease is not None, "no lease in 30 s"
    return lease


async def test_no_lease_token_admin_token_or_signature_is_shown_or_logged(services: Services) -> None:
    services.max_attempts = 1
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    executor = SleepExecutor(services.api_url, executor_token, "leaky")
    async with aiohttp.ClientSession() as session:
        await executor.register(session)
        async with session.post(f"{services.api_url}/api/v1/tasks", headers=_auth(admin), data=jsoncodec.dumps({
                "team": "search", "project": "ranker", "name": "leaky", "kind": "sleep", "subtask_size": 1,
                "input": {"records": [{"id": "a", "ms": 0}, {"id": "b", "ms": 0}, {"id": "c", "ms": 0}]}})) as resp:
            assert resp.status == 201, await resp.text()
        first, second, third = [await _claim(session, executor) for _ in range(3)]
        tokens = [lease["lease"]["token"] for lease in (first, second, third)]
        urls = [lease["subtask"]["output"]["url"] for lease in (first, second, third)]
        signatures = [parse_qs(urlsplit(url).query)["sig"][0] for url in urls]

        failure = (f"upload of the sibling subtask failed: PUT {urls[1]} answered 403; the other leases "
                   f"{tokens[1]} and {uuid.UUID(tokens[2]).hex.upper()} still run; ask an operator "
                   f"(admin {admin})")
        async with session.post(f"{services.api_url}/api/v1/leases/{tokens[0]}/fail", headers=_auth(executor_token),
                                data=jsoncodec.dumps({"error": failure, "retryable": False})) as resp:
            assert resp.status == 200, await resp.text()
        record_error = {"id": _only_id(second), "error": (
            f"model refused: lease {{{tokens[0]}}} is mine; retry {urls[2]} with {admin}")}
        for lease, output in ((second, jsoncodec.dumps_line(record_error)),
                              (third, jsoncodec.dumps_line({"id": _only_id(third), "slept_ms": 0}))):
            async with session.post(f"{services.api_url}/api/v1/leases/{lease['lease']['token']}/complete",
                                    headers=_auth(executor_token),
                                    data=jsoncodec.dumps({"records": 1, "output": output.decode()})) as resp:
                assert resp.status == 200, await resp.text()

        async def failed() -> Any:
            async with session.get(f"{services.api_url}{TASK}", headers=_auth(admin)) as resp:
                task = await resp.json()
            return task if task["status"] == "failed" else None

        task = await eventually(failed, "the task to fail")
        async with session.get(f"{services.api_url}{TASK}/subtasks", headers=_auth(admin)) as resp:
            assert resp.status == 200
            subtasks = await resp.text()
        async with session.get(f"{services.api_url}{TASK}/results", headers=_auth(admin)) as resp:
            assert resp.status == 200
            results = await resp.text()
    api_log = services.running["api"].log()
    assert "lease_failed" in api_log, api_log[-3000:]
    shown = {"task": jsoncodec.dumps_str(task), "/subtasks": subtasks, "results": results, "api log": api_log}
    secrets = [*tokens, *(uuid.UUID(t).hex for t in tokens), admin, *signatures]
    for where, body in shown.items():
        for secret in secrets:
            assert secret.lower() not in body.lower(), f"{secret} is in the {where}: {body[-2000:]}"
    # What is left still says what happened, in the record's own line too.
    lines = [jsoncodec.loads(line) for line in results.splitlines()]
    assert [line["id"] for line in lines] == ["a", "b", "c"], lines
    assert "[redacted]" in lines[0]["error"] and "still run" in lines[0]["error"], lines[0]
    assert lines[1]["error"].startswith("model refused: lease {[redacted]} is mine"), lines[1]
    assert lines[2] == {"id": "c", "slept_ms": 0}
    assert "[redacted]" in task["error"] and "[redacted]" in subtasks


def _only_id(lease: dict[str, Any]) -> Any:
    """The id of a one-record lease's record (its input rides inline in the claim)."""
    [line] = lease["subtask"]["input"]["data"].splitlines()
    return jsoncodec.loads(line)["id"]
