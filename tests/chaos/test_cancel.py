"""Drill: cancel a task mid-run.

Pending subtasks are cancelled at once; leased ones are told `cancelled` at their executor's next
heartbeat, and the agents stop them there (they do not run them to the end); results show what was
committed before, and {"id", "error": "task cancelled"} for every other record. The agents are free
for the next task straight away.
"""

from __future__ import annotations

import time
from datetime import datetime

from minions.testing.audit import audit
from minions.testing.cluster import HEARTBEAT_S, Cluster, eventually, log_events, pick, sleep_records


async def test_cancel_mid_task_stops_leased_work_at_the_next_heartbeat(cluster: Cluster) -> None:
    agents = await cluster.start_agents(pick(4, 8))
    long_ms = 4000
    quick = len(agents)
    records = [*sleep_records(quick, ms=100, prefix="quick"),
               *sleep_records(pick(24, 200), ms=long_ms, prefix="long")]
    await cluster.submit("cancel", records, subtask_size=1)

    async def mid_task() -> dict[str, list[tuple[int, str]]] | None:
        # Cancel when every agent is on a long subtask, and the quick ones are (mostly) done.
        task = await cluster.task("cancel")
        holders = await cluster.holders("cancel")
        busy = [name for name, held in holders.items() if all(sid >= quick for sid, _ in held)]
        return holders if task["records"]["done"] >= 2 and len(busy) == len(agents) else None

    holders = await eventually(mid_task, "every agent on a long subtask", timeout=30, interval=0.05)
    cancelled = await cluster.client.cancel("chaos", "drill", "cancel")
    cancelled_at = time.monotonic()
    assert cancelled["status"] == "cancelled", cancelled
    assert cancelled["subtasks"]["pending"] == 0 and cancelled["subtasks"]["leased"] == 0, cancelled
    stopped_by_cancel = {name: [sid for sid, _ in held] for name, held in holders.items()}

    # Every agent that held a lease drops it at its next heartbeat, long before the work would end.
    async def all_dropped() -> bool:
        for name in stopped_by_cancel:
            gone = [e for e in log_events(cluster.agent(name).log(), "lease_gone") if e.get("state") == "cancelled"]
            if not gone:
                return False
        return True

    await eventually(all_dropped, "the agents to drop their cancelled leases", timeout=long_ms / 1000,
                     interval=0.05)
    dropped_after = time.monotonic() - cancelled_at
    assert dropped_after < HEARTBEAT_S + 2.0, dropped_after
    for name in stopped_by_cancel:
        log = cluster.agent(name).log()
        labels = {e["subtask"] for e in log_events(log, "subtask_dropped") if e.get("reason") == "cancelled"}
        assert any("/cancel#" in label for label in labels), (name, labels)

    report = await audit(cluster, "cancel", records, status="cancelled")
    print(f"{report.summary()}; leases dropped {dropped_after:.2f} s after the cancel")
    assert report.states["cancelled"] >= len(agents) and report.states["done"] >= 2, report.states
    leased_at_cancel = {sid for sids in stopped_by_cancel.values() for sid in sids}
    for sid in leased_at_cancel:
        history = report.attempts[sid]
        assert report.subtasks[sid]["state"] == "cancelled", (sid, report.subtasks[sid])
        assert history[-1]["outcome"] == "cancelled" and history[-1]["error"] == "task cancelled", history
    # Nothing of the task was committed after the cancel.
    finished_at = datetime.fromisoformat(report.task["finished_at"])
    assert not any(a["outcome"] == "done" and a["ended_at"] > finished_at
                   for history in report.attempts.values() for a in history)

    # The agents are free: a new task runs at once.
    started = time.monotonic()
    follow = sleep_records(len(agents) * 2, ms=10, prefix="next")
    await cluster.submit("after-cancel", follow, subtask_size=1)
    await cluster.wait_finished("after-cancel", timeout=20)
    await audit(cluster, "after-cancel", follow)
    assert time.monotonic() - started < long_ms / 1000, "the agents were still busy with cancelled work"

