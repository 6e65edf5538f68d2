"""End to end with the services as real processes and executors that speak HTTP."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from minions import jsoncodec
from minions.sdk import MinionsClient
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually


async def _now(value: bool) -> bool:
    return value


async def wait_for_status(client: MinionsClient, name: str, statuses: tuple[str, ...],
                       timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task = await client.task("search", "ranker", name)
        if task["status"] in statuses:
            return task
        await asyncio.sleep(0.1)
    raise AssertionError(f"task {name} never reached {statuses}: {task}")


async def task_results(client: MinionsClient, name: str) -> list[dict[str, Any]]:
    body = b"".join([chunk async for chunk in client.results("search", "ranker", name)])
    return [jsoncodec.loads(line) for line in body.splitlines()]


async def test_2000_records_four_executors_every_record_once_in_order(services: Services) -> None:
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    records = [{"id": f"r{i:04d}", "ms": 1} for i in range(2000)]
    executors = [SleepExecutor(services.api_url, executor_token, f"test-{i}") for i in range(4)]
    stop = asyncio.Event()
    runners = [asyncio.create_task(e.run(stop)) for e in executors]
    try:
        async with MinionsClient(services.api_url, admin) as client:
            await client.submit({"team": "search", "project": "ranker", "name": "e2e", "kind": "sleep",
                                 "input": {"records": records}, "subtask_size": 25})
            task = await wait_for_status(client, "e2e", ("completed", "failed", "cancelled"), timeout=120)
            assert task["status"] == "completed", (task, services.logs())
            assert task["subtasks"]["total"] == 80 and task["records"] == {"total": 2000, "done": 2000}
            results = await task_results(client, "e2e")
    finally:
        stop.set()
        await asyncio.gather(*runners, return_exceptions=True)
    assert [r["id"] for r in results] == [r["id"] for r in records]
    assert all(r["slept_ms"] == 1 for r in results)
    assert sum(len(e.completed) for e in executors) == 80
    assert sum(1 for e in executors if e.completed) >= 2, "work was not shared among the executors"


async def test_splitter_catches_up_on_tasks_submitted_while_it_was_down(services: Services) -> None:
    services.workdir.mkdir(parents=True, exist_ok=True)
    services.split_at_submit = False  # the splitter's, not split at submission
    services.start("api")
    services.start("watchdog")
    await services.wait_healthy()
    admin, _ = await make_tokens(services.database_url)
    async with MinionsClient(services.api_url, admin) as client:
        await client.submit({"team": "search", "project": "ranker", "name": "early", "kind": "sleep",
                             "input": {"records": [{"id": i, "ms": 1} for i in range(10)]}, "subtask_size": 3})
        await asyncio.sleep(1)
        assert (await client.task("search", "ranker", "early"))["status"] == "submitted"
        services.start("splitter")
        task = await wait_for_status(client, "early", ("queued",), timeout=30)
        assert task["subtasks"]["total"] == 4 and task["records"]["total"] == 10


async def test_silent_executor_loses_its_lease_and_another_finishes(services: Services) -> None:
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    hung = SleepExecutor(services.api_url, executor_token, "hung", hang_after_claim=True)
    healthy = SleepExecutor(services.api_url, executor_token, "healthy")
    stop = asyncio.Event()
    async with MinionsClient(services.api_url, admin) as client:
        await client.submit({"team": "search", "project": "ranker", "name": "reclaim", "kind": "sleep",
                             "input": {"records": [{"id": "only", "ms": 1}]}})
        await wait_for_status(client, "reclaim", ("queued",))
        hung_run = asyncio.create_task(hung.run(stop))
        await wait_for_status(client, "reclaim", ("running",))
        claimed_at = time.monotonic()
        healthy_run = asyncio.create_task(healthy.run(stop))
        task = await wait_for_status(client, "reclaim", ("completed",), timeout=30)
        waited = time.monotonic() - claimed_at
        assert waited >= services.lease_timeout_s - 0.5, "reclaimed before the lease timeout"
        # The task turns completed when the commit does; the executor hears so a moment later (complete
        # then removes the attempt's object, now copied to its verified result).
        await eventually(lambda: _now(healthy.completed == [("reclaim", 0)]), "the healthy executor's commit")
        assert task["subtasks"]["done"] == 1
        executors = {e["name"]: e for e in await client.executors()}
        assert executors["hung"]["status"] == "lost"
        assert await task_results(client, "reclaim") == [{"id": "only", "slept_ms": 1}]
    stop.set()
    hung_run.cancel()
    await asyncio.gather(hung_run, healthy_run, return_exceptions=True)
