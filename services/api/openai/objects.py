"""OpenAI's file and batch objects, from our rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiohttp import web

from minions.nul import NUL_RULE
from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import invalid


def unix(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def team_scope(principal: Principal) -> str | None:
    """The team whose files and batches a token sees (None: every team, for unscoped tokens)."""
    return None if principal.role == "admin" else principal.team


def visible(principal: Principal, team: str | None) -> bool:
    scope = team_scope(principal)
    return scope is None or team == scope


def query_text(request: web.Request, name: str) -> str | None:
    """A text query parameter (an id, a purpose) the database will be asked about; None when absent
    or empty. 422 for one holding NUL, which no stored text holds (and PostgreSQL refuses)."""
    value = request.query.get(name) or None
    if value is not None and "\x00" in value:
        raise invalid({name: NUL_RULE})
    return value


def file_object(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "object": "file", "bytes": row["bytes"], "created_at": unix(row["created_at"]),
            "filename": row["filename"], "purpose": row["purpose"], "status": "processed",
            "expires_at": None, "status_details": None}


def batch_status(row: Any) -> str:
    if row["failed_at"] is not None:
        return "failed"
    for column, status in (("completed_at", "completed"), ("cancelled_at", "cancelled"),
                           ("expired_at", "expired")):
        if row[column] is not None:
            return status
    if row["ending"] == "cancel":
        return "cancelling"
    if row["finalizing_at"] is not None or row["task_finished_at"] is not None or row["ending"] == "expire":
        return "finalizing"
    return "in_progress"


def request_counts(row: Any) -> dict[str, int]:
    total = row["request_total"]
    if row["request_completed"] is not None:
        return {"total": total, "completed": row["request_completed"], "failed": row["request_failed"]}
    # In progress: records done, scaled to requests where an embeddings line holds several records.
    done = row["task_records_done"] or 0
    records = row["record_total"] or 1
    return {"total": total, "completed": min(total, done * total // records), "failed": 0}


def batch_object(row: Any) -> dict[str, Any]:
    errors = None
    if row["errors"] is not None:
        errors = {"object": "list", "data": row["errors"]}
    return {
        "id": row["id"], "object": "batch", "endpoint": row["endpoint"], "errors": errors,
        "input_file_id": row["input_file_id"], "completion_window": row["completion_window"],
        "status": batch_status(row), "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"], "created_at": unix(row["created_at"]),
        "in_progress_at": unix(row["in_progress_at"]), "expires_at": unix(row["expires_at"]),
        "finalizing_at": unix(row["finalizing_at"]), "completed_at": unix(row["completed_at"]),
        "failed_at": unix(row["failed_at"]), "expired_at": unix(row["expired_at"]),
        "cancelling_at": unix(row["cancelling_at"]), "cancelled_at": unix(row["cancelled_at"]),
        "request_counts": request_counts(row), "metadata": row["metadata"],
    }
