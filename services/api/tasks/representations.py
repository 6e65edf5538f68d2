"""How database rows look on the wire (API.md's task and lease objects)."""

from __future__ import annotations

from typing import Any

from minions.kinds import FINISHED_TASK_STATUSES
from minions.redaction import redact_failure
from minions.services.api.http.responses import iso
from minions.store.base import ObjectStore


def task_object(row: Any, store: ObjectStore) -> dict[str, Any]:
    finished = row["status"] in FINISHED_TASK_STATUSES
    return {
        "team": row["team"],
        "project": row["project"],
        "name": row["name"],
        "kind": row["kind"],
        "model": row["model"],
        # The model identity its results come from: fixed at submission (model@revision) or by its
        # first lease; null until then (and for sleep).
        "fingerprint": row.get("fingerprint"),
        "params": row["params"],
        "priority": row["priority"],
        "placement": row["placement"],
        "subtask_size": row["subtask_size"],
        "status": row["status"],
        "subtasks": {
            "total": row["subtasks_total"],
            "pending": row["subtasks_pending"],
            "leased": row["subtasks_leased"],
            # of those, worked on now; the others are claimed ahead by their executors (sql/schema/04_tasks.sql)
            "running": row.get("subtasks_running", row["subtasks_leased"]),
            # completed once, held until a spot check agrees (sql/schema/11_checks.sql)
            "checking": row["subtasks_checking"],
            "done": row["subtasks_done"],
            "failed": row["subtasks_failed"],
            "cancelled": row["subtasks_cancelled"],
        },
        "records": {
            # Known for sure once the split is done; until then, what has been split so far.
            "total": row["split_records"],
            "done": row["records_done_live"],  # the task row's counter plus its progress slots
        },
        "input_uri": row["input_uri"],
        "created_at": iso(row["created_at"]),
        "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]),
        "output_uri": (
            f"/api/v1/tasks/{row['team']}/{row['project']}/{row['name']}/results" if finished else None
        ),
        # Often an executor's failure text (the subtask's that failed the task).
        "error": redact_failure(row["error"]) if row["error"] is not None else None,
        "warnings": task_warnings(row),
    }


def task_warnings(row: Any) -> list[dict[str, str]]:
    """What stands in the task's way that it cannot fix itself. `servable` is false when no online
    executor serves the task's kind and model (for its team); NULL for a finished task. Starving: it
    waits while executors that could serve it serve others. Then what its results cannot be trusted
    for: results of executors quarantined after it ended."""
    suspect = [{"code": "quarantined_results",
                "message": f"{w['subtasks']} subtask result(s) came from executor {w['executor_id']}, quarantined "
                           f"since ({w['reason']}): they may be wrong"}
               for w in row.get("quarantined_results") or ()]
    return _waiting(row) + _starving(row) + _held(row) + _pin_released(row) + suspect


def _pin_released(row: Any) -> list[dict[str, str]]:
    """Its model pin was released: no online executor reported the fingerprint any more (the watchdog,
    MINIONS_PIN_RELEASE_S). Shown for good: the results kept may come from another build than the rest."""
    if row.get("pin_released_at") is None:
        return []
    return [{"code": "pin_released",
             "message": f"its model pin {row['pin_released_fingerprint']} was released at "
                        f"{iso(row['pin_released_at'])}: no online executor reported it any more. Results of "
                        "volunteers under it ran again; those of vouched executors were kept and may come from "
                        "another build of the model than the rest (`minions verify --all` re-runs them)"}]


def _held(row: Any) -> list[dict[str, str]]:
    """Volunteers' results held for a check past the check wait (MINIONS_SPOT_CHECK_WAIT_S): no executor of
    another owner could run their replicas. They commit only once one does."""
    held = row.get("held_for_check") or 0
    if not held or row.get("finished_at") is not None:
        return []
    return [{"code": "held_for_check",
             "message": f"{held} result(s) of volunteer executors are held until an executor of another owner "
                        "checks them (a trusted one serving this model settles them alone); none could within "
                        "the check wait"}]


def _starving(row: Any) -> list[dict[str, str]]:
    """Work pending and no lease since `starving_since` while executors that could serve the task
    were busy with other work (the watchdog's negotiation notes it: MINIONS_STARVATION_S)."""
    since = row.get("starving_since")
    if since is None or row.get("finished_at") is not None:
        return []
    return [{"code": "starving",
             "message": f"no executor has taken this task's pending work since {iso(since)} while executors "
                        "that could serve it run other work (its team's share, weight or lease cap: "
                        "`minions team shares`)"}]


def _waiting(row: Any) -> list[dict[str, str]]:
    if row.get("servable") is False:
        model = "" if row["kind"] == "sleep" else f" with model {row['model']}"
        return [{"code": "unservable",
                 "message": f"no online executor serves {row['kind']}{model}; the task waits until one that "
                            "does comes online (GET /api/v1/executors lists what each serves)"}]
    return []
