"""Logs that tell the truth and leak nothing (real services, real PostgreSQL).

- A client that hangs up mid-stream is a client disconnect (debug), not `database_unavailable`.
- Secrets an executor puts in a failure text (its lease token, a signed URL, an API token) reach
  neither the API's log nor what a user is shown (`/subtasks`, the task, results' error lines).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import yarl

from minions import jsoncodec
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually

TASK = "/api/v1/tasks/search/ranker"


async def _task(session: aiohttp.ClientSession, services: Services, admin: str, name: str) -> Any:
    async with session.get(f"{services.api_url}{TASK}/{name}", headers=_auth(admin)) as resp:
        return await resp.json()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _submit(session: aiohttp.ClientSession, services: Services, admin: str, body: dict[str, Any]) -> None:
    async with session.post(f"{services.api_url}/api/v1/tasks", headers=_auth(admin),
                            data=jsoncodec.dumps(body)) as resp:
        assert resp.status == 201, await resp.text()


async def _hang_up_mid_stream(services: Services, admin: str, name: str) -> None:
    """GET the results, read a little, and reset the connection while the server still writes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", services.port)
    writer.write(f"GET {TASK}/{name}/results HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\n\r\n"
                 .encode())
    await writer.drain()
    assert (await reader.readexactly(64 * 1024)).startswith(b"HTTP/1.1 200")
    writer.transport.abort()  # RST: the client is gone, the database is fine


async def test_a_client_that_hangs_up_mid_stream_is_a_client_disconnect(services: Services) -> None:
    services.extra_env["MINIONS_LOG_LEVEL"] = "debug"
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    # ~9 MB of results: far more than the socket buffers hold, so the server is mid-write at the reset.
    pad = "x" * 160
    records = [{"id": f"r{i:06d}-{pad}", "ms": 0} for i in range(50_000)]
    executor = SleepExecutor(services.api_url, executor_token, "disconnect-probe")
    stop = asyncio.Event()
    runner = asyncio.create_task(executor.run(stop))
    try:
        async with aiohttp.ClientSession() as session:
            await _submit(session, services, admin, {"team": "search", "project": "ranker", "name": "big",
                                                     "kind": "sleep", "input": {"records": records},
                                                     "subtask_size": 5000})

            async def completed() -> bool:
                return (await _task(session, services, admin, "big"))["status"] == "completed"

            await eventually(completed, "the task to complete", timeout_s=120)
    finally:
        stop.set()
        await asyncio.gather(runner, return_exceptions=True)
    for _ in range(5):
        await _hang_up_mid_stream(services, admin, "big")
    api = services.running["api"]
    await eventually(lambda: _async(any(e in api.log() for e in ("client_disconnected", "database_unavailable"))),
                     "the disconnect to be logged")
    events = [jsoncodec.loads(line) for line in api.log().splitlines() if line.startswith("{")]
    disconnects = [e for e in events if e["event"] == "client_disconnected"]
    assert disconnects and all(e["level"] == "debug" for e in disconnects), disconnects
    assert not [e for e in events if e["event"] == "database_unavailable"], api.log()[-3000:]
    assert not [e for e in events if e["level"] in ("error", "critical")], api.log()[-3000:]


async def _async(value: bool) -> bool:
    return value


async def test_secrets_in_a_failure_text_are_neither_logged_nor_shown(services: Services) -> None:
    services.max_attempts = 1
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    executor = SleepExecutor(services.api_url, executor_token, "leaky")
    async with aiohttp.ClientSession() as session:
        await executor.register(session)
        await _submit(session, services, admin, {"team": "search", "project": "ranker", "name": "leak",
                                                 "kind": "sleep", "input": {"records": [{"id": "a", "ms": 0}]}})
        lease = await executor.claim(session, wait_s=30)  # answers as soon as the subtask is pending
        assert lease is not None, "no lease in 30 s"
        token = lease["lease"]["token"]
        output_url = lease["subtask"]["output"]["url"]
        signature = parse_qs(urlsplit(output_url).query)["sig"][0]
        text = (f"PUT {output_url} failed; lease token={token}; "
                f"retry with Authorization: Bearer {executor_token}")
        async with session.post(f"{services.api_url}/api/v1/leases/{token}/fail", headers=_auth(executor_token),
                                data=jsoncodec.dumps({"error": text, "retryable": False})) as resp:
            assert resp.status == 200, await resp.text()

        async def failed() -> Any:
            task = await _task(session, services, admin, "leak")
            return task if task["status"] == "failed" else None

        task = await eventually(failed, "the task to fail")
        async with session.get(f"{services.api_url}{TASK}/leak/subtasks", headers=_auth(admin)) as resp:
            subtasks = await resp.text()
        async with session.get(yarl.URL(f"{services.api_url}{TASK}/leak/results"), headers=_auth(admin)) as resp:
            results = await resp.text()
    api_log = services.running["api"].log()
    assert "lease_failed" in api_log and "http_request" in api_log, api_log[-3000:]
    shown = {"api log": api_log, "/subtasks": subtasks, "results": results, "task": jsoncodec.dumps_str(task)}
    for where, body in shown.items():
        for secret in (signature, token, executor_token):
            assert secret not in body, f"a secret is in the {where}: {body[-2000:]}"
    # What is left still says what happened.
    assert "[redacted]" in subtasks and "/api/v1/store/" in subtasks, subtasks
