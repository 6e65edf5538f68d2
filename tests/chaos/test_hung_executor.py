"""Drill: an executor hangs (stops heartbeating but keeps its connection) and later tries to finish.

The watchdog reclaims its lease after the lease timeout and an agent runs the subtask again. The
hung executor then wakes while that second lease is still running, tries to write its output
(refused: 403 lease_ended, its output URL died with its lease) and to complete: refused (409
lease_lost), as are its heartbeat's claim to the lease, a fail and a release; its output appears
nowhere in the results, and the agent's commit goes through.
"""

from __future__ import annotations

import asyncio

from minions.testing.audit import audit
from minions.testing.cluster import LEASE_TIMEOUT_S, Cluster, eventually, pick, sleep_records
from minions.testing.drill_executors import DrillExecutor


async def test_hung_executor_late_result_is_refused_and_invisible(cluster: Cluster) -> None:
    # A claim takes one of the first few pending subtasks at random: those are long, so the second
    # run of the hung executor's subtask is still going when it wakes up and tries to complete.
    long_ms = 2500
    records = [*sleep_records(8, ms=long_ms, prefix="long"), *sleep_records(pick(22, 192), ms=30)]
    wake = asyncio.Event()
    hung = DrillExecutor(cluster.services.api_url, cluster.executor_token, "hung", hang_until=wake)
    stop = asyncio.Event()
    hung_run = asyncio.create_task(hung.run(stop))
    try:
        await cluster.submit("hang", records, subtask_size=1)
        await eventually(lambda: _leased(hung), "the hung executor to claim", timeout=20)
        sid, token = hung.leases[0]["subtask_id"], hung.leases[0]["token"]
        assert sid < 8, hung.leases
        await cluster.start_agents(pick(4, 6))

        # Reclaimed only after the lease timeout; then an agent takes the subtask again.
        async def rerun() -> str | None:
            holders = await cluster.holders("hang")
            return next((t for name, held in holders.items() if name != "hung" for s, t in held if s == sid), None)

        second = await eventually(rerun, f"an agent to run subtask {sid} again", timeout=LEASE_TIMEOUT_S + 15,
                                  interval=0.02)
        assert await cluster.attempt_outcome(token) == ["lost"]

        wake.set()  # the hung executor comes back while the agent's lease is live
        await eventually(lambda: _finished_late(hung), "the late completion", timeout=10)
        assert hung.late["put"] == 403  # its output URL died with its lease: a committed result cannot change
        assert hung.late["complete"] == 409 and hung.late["complete_code"] == "lease_lost", hung.late
        assert hung.late["heartbeat"] == 200 and hung.late["heartbeat_says_ok"] == 0, hung.late
        assert hung.late["fail"] == 409 and hung.late["release"] == 409, hung.late
        conn = await cluster.db()
        late_at = await conn.fetchval("SELECT now()")
        await conn.close()

        await cluster.wait_finished("hang", timeout=pick(40, 120))
    finally:
        stop.set()
        wake.set()
        hung_run.cancel()
        await asyncio.gather(hung_run, return_exceptions=True)
    report = await audit(cluster, "hang", records)
    print(report.summary())
    results = await cluster.results("hang")
    assert not any("late" in line for line in results)
    assert results[sid] == {"id": f"long{sid:05d}", "slept_ms": long_ms}
    history = report.attempts[sid]
    assert [a["outcome"] for a in history] == ["lost", "done"], history
    assert "no heartbeat" in history[0]["error"]
    # The second lease was live through the late calls, and committed afterwards, undisturbed.
    assert str(history[1]["lease_token"]) == second and history[1]["ended_at"] > late_at, history
    assert hung.completed == [] and hung.refused == 1


async def _leased(executor: DrillExecutor) -> bool:
    return bool(executor.leases)


async def _finished_late(executor: DrillExecutor) -> bool:
    return "release" in executor.late
