"""`GET /api/v1/tasks/{team}/{project}/{name}/subtasks`: a task's subtasks, for the web UI and
operators: state, current lease holder and the history of attempts."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.db.queries import Queries
from minions.redaction import redact_failure, redact_value
from minions.services.api.appkeys import POOL
from minions.services.api.auth import require
from minions.services.api.bodies import query_int
from minions.services.api.errors import invalid
from minions.services.api.routes.tasks import CURSOR, task_row

Q = Queries("web")
routes = web.RouteTableDef()
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


@routes.get("/api/v1/tasks/{team}/{project}/{name}/subtasks")
async def task_subtasks(request: web.Request) -> web.Response:
    """`?after=<subtask_id>&limit=<n>`: a page of subtasks in input order; `next` is the cursor of
    the following page, or null on the last one."""
    principal = require(request, "user")
    task = await task_row(request, principal)
    raw_after = request.query.get("after") or None
    after = -1
    if raw_after is not None:
        if not CURSOR.fullmatch(raw_after) or int(raw_after) > MAX_SUBTASK_ID:
            raise invalid({"after": "not a cursor this server returned"})
        after = int(raw_after)
    limit = query_int(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    rows = await request.app[POOL].fetch(Q.task_subtasks, task["id"], after, limit)
    next_cursor = str(rows[-1]["subtask_id"]) if len(rows) == limit else None
    body = {"subtasks": [_subtask(r) for r in rows], "next": next_cursor}
    return web.Response(body=jsoncodec.dumps(body), content_type="application/json")
