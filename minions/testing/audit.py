"""The audit every drill ends with: nothing lost, nothing twice, every retry explained.

1. The task has ended with the status the drill expects; its counters agree with its subtasks.
2. The results stream holds every input record exactly once, in input order: a done subtask's
   records as `{"id", "slept_ms"}` (the value the input asked for), a failed one's as
   `{"id", "error": <its last error>}`, a cancelled one's as `{"id", "error": "task cancelled"}`.
3. No subtask is left pending or leased; no referee row or backup outlives its task.
4. Attempt history explains every retry: for each subtask, the attempts that counted are numbered
   1..attempts; every attempt but the last ended `lost` or `failed` with a reason; a `released`
   attempt did not count; a `superseded` one lost the race to a committed copy of itself; a done
   subtask's committed output is the one its single `done` attempt wrote; a failed one carries the
   error of its last attempt.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from minions.db.connect import connect

ENDED = ("done", "failed", "lost", "released", "cancelled", "superseded")
NEEDS_REASON = ("failed", "lost")
RETRY_CAUSES = ("failed", "lost")


@dataclass
class AuditReport:
    task: dict[str, Any]
    states: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    retried: dict[int, int] = field(default_factory=dict)  # subtask_id -> attempts, where > 1
    attempts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    subtasks: dict[int, dict[str, Any]] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.task['name']}: {self.task['status']}, subtasks {dict(self.states)}, attempts "
                f"{dict(self.outcomes)}, retried {len(self.retried)}")


async def audit(cluster: Any, name: str, records: list[dict[str, Any]], *,
                status: str = "completed") -> AuditReport:
    """Runs the whole audit of task `name` (whose input was `records`); raises AssertionError on
    the first broken promise, with enough context to see why."""
    task = await cluster.task(name)
    assert task["status"] == status, f"task {name} ended {task['status']}, expected {status}: {task}"
    assert task["finished_at"] is not None
    results = await cluster.results(name)

    conn = await connect(cluster.database_url)
    try:
        row = await conn.fetchrow("SELECT * FROM tasks WHERE team = $1 AND project = $2 AND name = $3",
                                  task["team"], task["project"], name)
        assert row is not None
        subtasks = [dict(r) for r in await conn.fetch(
            "SELECT * FROM subtasks WHERE task_id = $1 ORDER BY subtask_id", row["id"])]
        attempts = [dict(r) for r in await conn.fetch(
            "SELECT * FROM subtask_attempts WHERE task_id = $1 ORDER BY subtask_id, ended_at, attempt", row["id"])]
        referees = await conn.fetchval("SELECT count(*) FROM minion_subtask_acquirement WHERE task_id = $1",
                                       row["id"])
        backups = await conn.fetchval("SELECT count(*) FROM subtask_backups WHERE task_id = $1", row["id"])
        compacted = await conn.fetchval("SELECT minion_task_compacted($1)", row["id"])
        output_keys = {(r["subtask_id"], r["token"]): r["key"] for r in await conn.fetch(
            """SELECT subtask_id, lease_token AS token,
                      minion_output_key(task_id, subtask_id, attempts, lease_token) AS key
                 FROM subtasks WHERE task_id = $1 AND state = 'done'""", row["id"])}
    finally:
        await conn.close()

    report = AuditReport(task)
    report.subtasks = {s["subtask_id"]: s for s in subtasks}
    for a in attempts:
        report.attempts.setdefault(a["subtask_id"], []).append(a)
        report.outcomes[a["outcome"]] += 1
    report.states.update(s["state"] for s in subtasks)

    # 1. The task's own bookkeeping.
    assert row["split_done"], f"{name}: split never finished"
    assert row["open_subtasks"] == 0, f"{name}: open_subtasks = {row['open_subtasks']}"
    assert row["failed_subtasks"] == report.states["failed"], (row["failed_subtasks"], report.states)
    if status == "completed":
        assert set(report.states) == {"done"}, report.states
    elif status == "failed":
        assert report.states["failed"] > 0 and "cancelled" not in report.states, report.states
        assert row["error"], f"{name} failed without an error"
    counts = task["subtasks"]
    assert counts["pending"] == 0 and counts["leased"] == 0 and counts.get("checking", 0) == 0, counts
    assert counts["total"] == len(subtasks) == sum(counts[k] for k in ("done", "failed", "cancelled")), counts
    assert task["records"]["total"] == len(records), task["records"]

    # 3. Nothing left in flight.
    stuck = [s["subtask_id"] for s in subtasks if s["state"] in ("pending", "leased", "checking")]
    assert not stuck, f"{name}: subtasks left pending or leased: {stuck}"
    assert referees == 0, f"{name}: {referees} referee rows outlive the task"
    assert backups == 0, f"{name}: {backups} backup leases outlive the task"

    # The subtasks tile the input, in order.
    expected_first = 0
    for s in subtasks:
        assert s["first_record"] == expected_first, f"subtask {s['subtask_id']} starts at {s['first_record']}"
        expected_first += s["records"]
    assert expected_first == len(records), f"subtasks cover {expected_first} of {len(records)} records"

    # 2. Every record exactly once, in order, in the shape its subtask's end calls for.
    ids = [r.get("id") for r in results]
    want_ids = [r["id"] for r in records]
    if ids != want_ids:
        dupes = [i for i, c in Counter(ids).items() if c > 1]
        missing = sorted(set(want_ids) - set(ids), key=str)
        raise AssertionError(f"{name}: results are not the input once in order: {len(ids)} lines for "
                             f"{len(want_ids)} records; duplicated {dupes[:10]}, missing {missing[:10]}")
    for s in subtasks:
        first, count = s["first_record"], s["records"]
        for record, line in zip(records[first:first + count], results[first:first + count], strict=True):
            if s["state"] == "done":
                want: dict[str, Any] = {"id": record["id"], "slept_ms": record["ms"]}
            elif s["state"] == "failed":
                want = {"id": record["id"], "error": s["last_error"]}
            else:
                want = {"id": record["id"], "error": "task cancelled"}
            assert line == want, f"{name} subtask {s['subtask_id']} ({s['state']}): {line} != {want}"

    # 4. Attempt history.
    for s in subtasks:
        sid = s["subtask_id"]
        history = report.attempts.get(sid, [])
        where = f"{name} subtask {sid} ({s['state']}, attempts={s['attempts']}): {_show(history)}"
        tokens = [a["lease_token"] for a in history]
        assert len(tokens) == len(set(tokens)), f"a lease ended twice: {where}"
        for a in history:
            assert a["outcome"] in ENDED, where
            if a["outcome"] in NEEDS_REASON:
                assert a["error"], f"a {a['outcome']} attempt without a reason: {where}"
        counted = {a["attempt"] for a in history if a["outcome"] != "released"}
        assert counted == set(range(1, s["attempts"] + 1)), f"attempt numbers do not add up: {where}"
        for k in range(1, s["attempts"]):
            assert any(a["attempt"] == k and a["outcome"] in RETRY_CAUSES for a in history), \
                f"attempt {k} was retried with no lost/failed attempt to explain it: {where}"
        done = [a for a in history if a["outcome"] == "done"]
        if s["state"] == "done":
            assert len(done) == 1, f"committed {len(done)} times: {where}"
            commit = done[0]
            assert commit["lease_token"] == s["lease_token"], f"the committed lease is not the done attempt: {where}"
            assert commit["records"] == s["records"], where
            assert s["output_key"] == output_keys[(sid, s["lease_token"])], where
            assert s["output_key"].endswith(f"/{commit['attempt']}-{commit['lease_token']}.jsonl"), where
            # Committed through the API: a verified copy of that attempt's output under a key no URL
            # names, so no executor can rewrite it later, or its bytes kept in the row (sql/schema/07_results.sql;
            # dropped once the task's parts serve them).
            if s["result_key"] is not None:
                assert s["result_key"].startswith(f"results/{s['task_id']}/{sid}/{commit['attempt']}-"
                                                  f"{commit['lease_token']}-"), where
            else:
                assert s["result_data"] is not None or compacted, f"a committed result with no bytes: {where}"
            assert len(s["result_sha256"]) == 32 and s["result_bytes"] > 0, where
            assert all(a["ended_at"] <= commit["ended_at"] for a in history), \
                f"an attempt ended after the commit: {where}"
        else:
            assert not done, f"a {s['state']} subtask has a committed attempt: {where}"
        if any(a["outcome"] == "superseded" for a in history):
            assert s["state"] == "done", f"superseded by nothing: {where}"
        if s["state"] == "failed":
            last = [a for a in history if a["outcome"] != "released"][-1]
            assert last["outcome"] in RETRY_CAUSES, f"failed, but its last attempt {last['outcome']}: {where}"
            assert s["last_error"] and last["error"] == s["last_error"], f"failed with another error: {where}"
        if s["state"] == "cancelled" and history:
            assert history[-1]["outcome"] in ("cancelled", "lost", "failed", "released"), where
        if s["attempts"] > 1:
            report.retried[sid] = s["attempts"]
    return report


def _show(history: list[dict[str, Any]]) -> str:
    return "; ".join(f"#{a['attempt']} {a['outcome']}" + (f" ({a['error'][:60]})" if a["error"] else "")
                     for a in history) or "no attempts"
