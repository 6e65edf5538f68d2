"""Tasks over HTTP: submit, list, show, cancel, retry, verify, delete, and a task's subtasks. Each
handler decodes the request, calls its use case (submission.py, lifecycle.py, subtasks.py) and
encodes the answer (representations.py)."""

from __future__ import annotations

import asyncio
import functools
import re
import secrets

from aiohttp import web

from minions.kinds import TASK_STATUSES
from minions.names import NAME, NAME_RULE, is_name
from minions.services.api.context import Context
from minions.services.api.http.auth import require
from minions.services.api.http.bodies import THREAD_ABOVE, json_object, query_int
from minions.services.api.http.errors import forbidden, invalid
from minions.services.api.http.responses import json_response
from minions.services.api.tasks import lifecycle, submission, subtasks
from minions.services.api.tasks.lookup import task_of_path
from minions.services.api.tasks.representations import task_object
from minions.services.api.tasks.submission_body import read_submission
from minions.services.api.tasks.validation import validate_task

routes = web.RouteTableDef()
CURSOR = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses
INTERACTIVE_FILTERS = ("false", "true", "all")  # ?interactive= of the task list: the lane's requests out, only, or both
DRY_RUN = {"true": True, "1": True, "false": False, "0": False}


@routes.post("/api/v1/tasks")
async def submit_task(request: web.Request) -> web.Response:
    principal = require(request, "user")
    submission_body = await read_submission(request, request.app._client_max_size)
    # Authorize before the records are looked at: a token of another team costs us one read.
    team = submission_body.fields.get("team")
    if isinstance(team, str) and NAME.match(team) and not principal.can_see_team(team):
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    # Up to 64 MiB of inline records: validated in a thread so claims and heartbeats keep flowing.
    validate = functools.partial(validate_task, submission_body.fields, submission_body.records,
                                 submission_body.errors)
    big = submission_body.records is not None and len(submission_body.records) > THREAD_ABOVE
    dry_run = request.query.get("dry_run") or "false"  # empty reads as absent
    if dry_run not in DRY_RUN:
        raise invalid({"dry_run": "true or false (1 or 0)"})
    task = await asyncio.to_thread(validate) if big else validate()
    ctx = Context.of(request)
    try:
        if DRY_RUN[dry_run]:
            await submission.judge(ctx, principal, task)
            return json_response({"valid": True})
        row, created = await submission.submit(ctx, principal, task)
    finally:
        if task.records is not None:
            task.records.close()
    return json_response(task_object(row, ctx.store), 201 if created else 200)


@routes.get("/api/v1/tasks")
async def list_tasks(request: web.Request) -> web.Response:
    principal = require(request, "user")
    team = request.query.get("team") or None
    if principal.role != "admin" and principal.team is not None:
        if team is not None and team != principal.team:
            return json_response({"tasks": [], "next": None})
        team = principal.team
    project = request.query.get("project") or None
    status = request.query.get("status") or None
    errors = {}
    for key, value in (("team", team), ("project", project)):
        if value is not None and not NAME.match(value):
            errors[key] = "not a valid name"
    if status is not None and status not in TASK_STATUSES:
        errors["status"] = f"must be one of {', '.join(TASK_STATUSES)}"
    # The OpenAI interactive lane makes a task per request: hidden unless asked for, so that they do
    # not crowd out the batch work a list is for.
    interactive = request.query.get("interactive") or "false"
    if interactive not in INTERACTIVE_FILTERS:
        errors["interactive"] = f"must be one of {', '.join(INTERACTIVE_FILTERS)}"
    cursor_raw = request.query.get("cursor") or None
    cursor = None
    if cursor_raw is not None:
        if not CURSOR.fullmatch(cursor_raw) or int(cursor_raw) > 2**63 - 1:
            errors["cursor"] = "not a cursor this server returned"
        else:
            cursor = int(cursor_raw)
    if errors:
        raise invalid(errors)
    limit = query_int(request, "limit", 50, 1, 500)
    ctx = Context.of(request)
    rows = await ctx.gateway.list_tasks(team=team, project=project, status=status, before_id=cursor, limit=limit,
                                        interactive=interactive)
    next_cursor = str(rows[-1]["id"]) if len(rows) == limit else None
    return json_response({"tasks": [task_object(r, ctx.store) for r in rows], "next": next_cursor})


@routes.get("/api/v1/tasks/{team}/{project}/{name}")
async def show_task(request: web.Request) -> web.Response:
    principal = require(request, "user")
    return json_response(task_object(await task_of_path(request, principal), Context.of(request).store))


@routes.post("/api/v1/tasks/{team}/{project}/{name}/cancel")
async def cancel_task(request: web.Request) -> web.Response:
    principal = require(request, "user")
    task = await task_of_path(request, principal)
    ctx = Context.of(request)
    return json_response(task_object(await lifecycle.cancel(ctx, task), ctx.store))


@routes.post("/api/v1/tasks/{team}/{project}/{name}/retry")
async def retry_task(request: web.Request) -> web.Response:
    """A failed task's failed subtasks run again, each with a fresh budget of attempts; its committed
    results stay (sql/schema/04_tasks.sql, minion_retry_task)."""
    principal = require(request, "user")
    task = await task_of_path(request, principal)
    ctx = Context.of(request)
    return json_response(task_object(await lifecycle.retry(ctx, task), ctx.store))


@routes.post("/api/v1/tasks/{team}/{project}/{name}/verify")
async def verify_task(request: web.Request) -> web.Response:
    """A finished task's results run again by others as a task of their own (sql/schema/11_checks.sql):
    those that came from an executor quarantined since (or every one, `"all": true`). The caller
    compares the two tasks' results by record id (`minions verify`)."""
    principal = require(request, "user")
    task = await task_of_path(request, principal)
    body = await json_object(request, optional=True, limit=4096)
    unknown = sorted(set(body) - {"all", "name"})
    every = body.get("all", False)
    name = body.get("name", f"{task['name'][:48]}-verify-{secrets.token_hex(3)}")
    errors = {**{k: "unknown field" for k in unknown},
              **({"all": "must be true or false"} if not isinstance(every, bool) else {}),
              **({"name": NAME_RULE} if not isinstance(name, str) or not is_name(name) else {})}
    if errors:
        raise invalid(errors)
    ctx = Context.of(request)
    made, count = await lifecycle.verify(ctx, task, name=name, every=every, token_id=principal.token_id)
    shown = None if made is None else task_object(made, ctx.store)
    return json_response({"task": shown, "subtasks": count}, status=201 if shown else 200)


@routes.delete("/api/v1/tasks/{team}/{project}/{name}")
async def delete_task(request: web.Request) -> web.Response:
    """A finished task goes, with its subtasks; its input and results are garbage from then on."""
    principal = require(request, "user")
    await lifecycle.delete(Context.of(request), await task_of_path(request, principal))
    return json_response({"status": "ok"})


@routes.get("/api/v1/tasks/{team}/{project}/{name}/subtasks")
async def task_subtasks(request: web.Request) -> web.Response:
    """`?after=<subtask_id>&limit=<n>`: a page of subtasks in input order; `next` is the cursor of
    the following page, or null on the last one."""
    principal = require(request, "user")
    task = await task_of_path(request, principal)
    raw_after = request.query.get("after") or None
    after = -1
    if raw_after is not None:
        if not CURSOR.fullmatch(raw_after) or int(raw_after) > subtasks.MAX_SUBTASK_ID:
            raise invalid({"after": "not a cursor this server returned"})
        after = int(raw_after)
    limit = query_int(request, "limit", subtasks.DEFAULT_LIMIT, 1, subtasks.MAX_LIMIT)
    return json_response(await subtasks.page(Context.of(request), task, after=after, limit=limit))
