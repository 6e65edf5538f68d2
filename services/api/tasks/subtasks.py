"""A task's subtasks as `GET /api/v1/tasks/{team}/{project}/{name}/subtasks` shows them, for the web
UI and operators: state, current lease holder and the history of attempts, failure texts redacted."""

from __future__ import annotations

from typing import Any

from minions.redaction import redact_failure, redact_value
from minions.services.api.context import Context
from minions.services.api.gateway import TaskRow

DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
MAX_SUBTASK_ID = 2**31 - 1  # subtask_id is an integer column


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _subtask(row: Any) -> dict[str, Any]:
    return {
        "subtask_id": row["subtask_id"],
        "state": row["state"],
        "records": row["records"],
        "attempts": row["attempts"],
        "executor": row["executor"],
        "leased_at": _iso(row["leased_at"]),
        "done_at": _iso(row["done_at"]),
        # Failure text comes from executors: shown with its secrets redacted (stored rows may predate
        # redaction at fail, or its redaction of other leases' tokens).
        "last_error": redact_failure(row["last_error"]) if row["last_error"] is not None else None,
        "history": [_attempt(a) for a in row["history"]],
    }


def _attempt(attempt: dict[str, Any]) -> dict[str, Any]:
    shown: dict[str, Any] = redact_value(attempt)
    if attempt.get("error") is not None:
        shown["error"] = redact_failure(attempt["error"])
    return shown


async def page(ctx: Context, task: TaskRow, *, after: int, limit: int) -> dict[str, Any]:
    """A page of subtasks in input order after subtask `after`; `next` is the cursor of the
    following page, or None on the last one."""
    rows = await ctx.gateway.task_subtasks(task_id=task["id"], after=after, limit=limit)
    next_cursor = str(rows[-1]["subtask_id"]) if len(rows) == limit else None
    return {"subtasks": [_subtask(r) for r in rows], "next": next_cursor}
