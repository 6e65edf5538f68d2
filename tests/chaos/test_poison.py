"""Drill: a poison subtask, failing every time it runs.

The sleep runner of the agent has no failure mode, so this drill runs test executors
(minions/testing/drill_executors.py) that fail, retryably through POST /leases/{token}/fail, any subtask
holding a record marked `"poison": true` (an extra field: the API keeps it, the sleep kind ignores
it). The subtask is failed for good after max_attempts with its error; the rest of the task runs to
the end; the task ends `failed`, with results for every other record and an {"id", "error"} line
for each record of the poison subtask.
"""

from __future__ import annotations

import asyncio

from minions.testing.audit import audit
from minions.testing.cluster import Cluster, pick, sleep_records
from minions.testing.drill_executors import POISON_ERROR, DrillExecutor


async def test_poison_subtask_fails_after_max_attempts_and_the_rest_completes(cluster: Cluster) -> None:
    size = 2
    records = sleep_records(pick(40, 400), ms=20)
    poisoned = pick([13], [13, 101, 257, 399])
    for i in poisoned:
        records[i]["poison"] = True
    executors = [DrillExecutor(cluster.services.api_url, cluster.executor_token, f"drill-{i}")
                 for i in range(pick(3, 6))]
    stop = asyncio.Event()
    runs = [asyncio.create_task(e.run(stop)) for e in executors]
    try:
        await cluster.submit("poison", records, subtask_size=size)
        task = await cluster.wait_finished("poison", timeout=pick(40, 120))
    finally:
        stop.set()
        await asyncio.gather(*runs, return_exceptions=True)

    # The audit checks the records of the failed subtasks read {"id", "error": <its last error>}.
    report = await audit(cluster, "poison", records, status="failed")
    print(report.summary())
    max_attempts = cluster.services.max_attempts
    bad = {i // size for i in poisoned}
    assert {sid for sid, s in report.subtasks.items() if s["state"] == "failed"} == bad
    assert report.states["done"] == len(report.subtasks) - len(bad)
    for sid in bad:
        first = report.subtasks[sid]["first_record"]
        bad_id = next(r["id"] for r in records[first:first + size] if r.get("poison"))
        error = POISON_ERROR.format(id=bad_id)
        s, history = report.subtasks[sid], report.attempts[sid]
        assert s["attempts"] == max_attempts and s["last_error"] == error, s
        assert [(a["attempt"], a["outcome"], a["error"]) for a in history] == [
            (k, "failed", error) for k in range(1, max_attempts + 1)]
    assert task["subtasks"]["failed"] == len(bad)
    assert any(task["error"].startswith(f"subtask {sid} failed after {max_attempts} attempt(s): poison record")
               for sid in bad), task["error"]
    results = await cluster.results("poison")
    assert sum("error" in line for line in results) == size * len(bad)
    assert sum(len(e.failed) for e in executors) == max_attempts * len(bad)
