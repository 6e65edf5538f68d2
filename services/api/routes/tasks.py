"""Tasks: submit, list, show, cancel, retry, results; and inputs for clients without an S3 of their own."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import secrets
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from aiohttp import web

from minions import jsoncodec, readahead
from minions.committed_results import (
    VERIFY_IN_MEMORY,
    ResultCompacted,
    ResultCorrupted,
    committed_uri,
    read_committed,
    read_verified,
)
from minions.db.queries import Queries
from minions.kinds import FINISHED_TASK_STATUSES, TASK_STATUSES
from minions.logging import get_logger
from minions.names import NAME, NAME_RULE, is_name
from minions.records import parse_line
from minions.redaction import redact_failure
from minions.services.api import inputs
from minions.services.api.appkeys import POOL, SETTINGS, STORE, WAITERS
from minions.services.api.auth import Principal, require
from minions.services.api.bodies import THREAD_ABOVE, json_object, query_int
from minions.services.api.errors import ApiError, conflict, forbidden, invalid, not_found
from minions.services.api.inline_records import SpooledRecords
from minions.services.api.inline_split import SplitRanges, cut_small
from minions.services.api.priority_cap import capped, refused_above_cap
from minions.services.api.representations import task_object
from minions.services.api.responses import json_response
from minions.services.api.submission_body import read_submission
from minions.services.api.validation import TaskRequest, validate_task
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

Q = Queries("api")
log = get_logger(__name__)
routes = web.RouteTableDef()
CURSOR = re.compile(r"[0-9]{1,19}")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses
INTERACTIVE_FILTERS = ("false", "true", "all")  # ?interactive= of the task list: the lane's requests out, only, or both
RESULT_PAGE = 200
RESULT_READ_AHEAD = 16  # committed results read at once while streaming (each ≤ VERIFY_IN_MEMORY held)
PART_URL_S = 3600.0  # how long the presigned URLs of ?format=parts work
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
CUT_ON_LOOP = 16 * 1024  # inline records up to this are split on the event loop


class DigestMismatch(Exception):
    """An upload's body is not the bytes its `sha256` names."""


async def task_row(request: web.Request, principal: Principal) -> Any:
    team, project, name = (request.match_info[k] for k in ("team", "project", "name"))
    if not (is_name(team) and is_name(project) and is_name(name)) or not principal.can_see_team(team):
        raise not_found(f"task {team}/{project}/{name}")  # other teams' tasks do not exist for you
    row = await request.app[POOL].fetchrow(Q.task_by_name, team, project, name)
    if row is None:
        raise not_found(f"task {team}/{project}/{name}")
    return row


@routes.post("/api/v1/tasks")
async def submit_task(request: web.Request) -> web.Response:
    principal = require(request, "user")
    submission = await read_submission(request, request.app._client_max_size)
    # Authorize before the records are looked at: a token of another team costs us one read.
    team = submission.fields.get("team")
    if isinstance(team, str) and NAME.match(team) and not principal.can_see_team(team):
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    # Up to 64 MiB of inline records: validated in a thread so claims and heartbeats keep flowing.
    validate = functools.partial(validate_task, submission.fields, submission.records, submission.errors)
    big = submission.records is not None and len(submission.records) > THREAD_ABOVE
    dry_run = request.query.get("dry_run") or "false"  # empty reads as absent
    if dry_run not in DRY_RUN:
        raise invalid({"dry_run": "true or false (1 or 0)"})
    task = await asyncio.to_thread(validate) if big else validate()
    try:
        if DRY_RUN[dry_run]:
            return await _judged(request, principal, task)
        return await _submit(request, principal, task)
    finally:
        if task.records is not None:
            task.records.close()


async def _submit(request: web.Request, principal: Principal, task: TaskRequest) -> web.Response:
    if not principal.can_see_team(task.team):
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    pool, store = request.app[POOL], request.app[STORE]

    ranges = await _small_split(request, task)
    input_uri = None
    if ranges is None or ranges.kept is None:
        # Judged before an input object is written for it (and again by the submission itself,
        # should an admin lower the cap meanwhile). A small task's submission alone judges it.
        await _judge_cap(request, principal, task)
        # An input object: not written for a re-submission of an existing task.
        existing = await pool.fetchrow(Q.task_request_hash, task.team, task.project, task.name)
        if existing is not None:
            return await _resubmitted(request, task, existing)
        input_uri = await _store_input(request, principal, task)
    # One function call: the task, the subtasks of a small one, and its records when they are kept in
    # the database (sql/schema/04_tasks.sql, sql/schema/08_inputs.sql).
    split = (ranges.byte_starts, ranges.byte_ends, ranges.first_records, ranges.records, ranges.kept) \
        if ranges is not None else (None,) * 5
    quota = request.app[SETTINGS].team_input_quota_bytes
    try:
        # The team's priority cap is read by this very statement (a user's priority above it: 403,
        # nothing committed), so the common submission stays one round trip.
        with refused_above_cap(task.team, task.priority):
            row = await pool.fetchrow(
                Q.submit_task, task.team, task.project, task.name, task.kind, task.model, task.params,
                task.priority, task.subtask_size, None, input_uri, task.request_hash, principal.token_id, *split,
                quota, capped(principal), task.placement,
            )
    except asyncpg.ConfigurationLimitExceededError:  # a kept input past the team's quota: nothing committed
        raise inputs.quota_exceeded(task.team, int(await pool.fetchval(Q.team_input_bytes, task.team)),
                                    quota) from None
    if row is None:  # the name is taken (or was, in a race): answered like a re-submission
        existing = await pool.fetchrow(Q.task_request_hash, task.team, task.project, task.name)
        if input_uri is not None and task.records is not None and existing["request_hash"] != task.request_hash:
            # Only a different body's input is ours alone to remove: an identical body wrote the very
            # object (keyed by its hash) that the winning task reads.
            await store.delete(input_uri)
        return await _resubmitted(request, task, existing)
    if ranges is not None:
        # Split here: its subtasks are claimable now. This process's waiting claims start at once,
        # not a NOTIFY's round trip later (the NOTIFY still wakes those of every API process).
        request.app[WAITERS].wake(row["capability"])
    log.info("task_submitted", task=f"{task.team}/{task.project}/{task.name}", kind=task.kind,
             model=task.model, split_at_submit=ranges is not None, input_kept=input_uri is None)
    return json_response(task_object(row, store), 201)


DRY_RUN = {"true": True, "1": True, "false": False, "0": False}


async def _judged(request: web.Request, principal: Principal, task: TaskRequest) -> web.Response:
    """`?dry_run=true`: every check a submission makes before it creates anything (the fields and
    records, the team's scope, the priority cap), and nothing created: `submit --replace` asks this
    before it deletes the task the new one replaces, so a refused body leaves the old one."""
    if not principal.can_see_team(task.team):
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    await _judge_cap(request, principal, task)
    return json_response({"valid": True})


async def _judge_cap(request: web.Request, principal: Principal, task: TaskRequest) -> None:
    """A user's task judged by the team's cap and existence (403 priority_above_cap / unknown_team),
    before anything of it is written; an admin's is not held to them."""
    if capped(principal):
        with refused_above_cap(task.team, task.priority):
            await request.app[POOL].fetchval(Q.priority_within_cap, task.team, task.priority, True)


async def _small_split(request: web.Request, task: TaskRequest) -> SplitRanges | None:
    """The subtasks of small inline records, cut here (services/api/inline_split.py), with the
    records themselves when they are kept in the database; None leaves the split to the splitter."""
    settings = request.app[SETTINGS]
    limit = settings.inline_split_max_bytes
    if task.records is None or task.records.size > limit:
        return None
    cut = functools.partial(cut_small, task.records, task.kind, task.subtask_size, limit,
                            settings.input_in_database_bytes)
    # A few KiB of records are cut on the loop (as they were validated there): a thread's round trip
    # would cost more than the work.
    return cut() if task.records.size <= CUT_ON_LOOP else await asyncio.to_thread(cut)


async def _resubmitted(request: web.Request, task: TaskRequest, existing: Any) -> web.Response:
    """Idempotent submission: the same body again returns the task; a different one is a conflict."""
    if existing["request_hash"] != task.request_hash:
        raise conflict("task_exists",
                       f"task {task.team}/{task.project}/{task.name} exists with a different definition: submit "
                       "under another name; if it failed, retry it (POST …/retry, `minions retry`); or delete it "
                       "first, its results with it (`minions submit --replace` does)")
    row = await request.app[POOL].fetchrow(Q.task_by_id, existing["id"])
    return json_response(task_object(row, request.app[STORE]), 200)


async def _store_input(request: web.Request, principal: Principal, task: TaskRequest) -> str:
    pool, store, settings = request.app[POOL], request.app[STORE], request.app[SETTINGS]
    if task.records is not None:
        key = f"inputs/{task.team}/{task.project}/{task.name}-{task.request_hash[:16]}.jsonl"
        # Recorded (within the team's quota) before it is written: a crash in between leaves a
        # record the garbage collector removes, never an object nobody accounts for.
        await inputs.record_input(pool, settings, store.uri_for(key), task.team, task.records.size,
                                  principal.token_id)
        uri, _ = await store.put_stream(key, _spooled_chunks(task.records))
        return uri
    assert task.input_uri is not None
    # Scoped to the submitter's team: before anything is read or created.
    await inputs.check_input_use(pool, principal, task.team, task.input_uri)
    if not store.readable(task.input_uri):
        raise invalid({"input.uri": f"not readable by this server's store ({store.root_uri}); "
                                    "upload it with POST /api/v1/inputs or use an s3:// URI"})
    try:
        size = await store.size(task.input_uri)
    except StoreError as exc:  # e.g. access denied: the client's URI, not an outage of ours
        raise invalid({"input.uri": f"cannot be read: {exc}"}) from None
    if size is None:
        raise invalid({"input.uri": "no such object"})
    return task.input_uri


async def _spooled_chunks(records: SpooledRecords) -> AsyncIterator[bytes]:
    chunks = records.chunks()
    while (chunk := await asyncio.to_thread(next, chunks, b"")) != b"":
        yield chunk


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
    rows = await request.app[POOL].fetch(Q.list_tasks, team, project, status, cursor, limit, interactive)
    store = request.app[STORE]
    next_cursor = str(rows[-1]["id"]) if len(rows) == limit else None
    return json_response({"tasks": [task_object(r, store) for r in rows], "next": next_cursor})


@routes.get("/api/v1/tasks/{team}/{project}/{name}")
async def show_task(request: web.Request) -> web.Response:
    principal = require(request, "user")
    return json_response(task_object(await task_row(request, principal), request.app[STORE]))


@routes.post("/api/v1/tasks/{team}/{project}/{name}/cancel")
async def cancel_task(request: web.Request) -> web.Response:
    principal = require(request, "user")
    row = await task_row(request, principal)
    pool = request.app[POOL]
    if not await pool.fetchval(Q.cancel_task, row["id"]):
        if row["status"] != "cancelled":
            raise conflict("task_finished", f"task is already {row['status']}; only a running task can be "
                                            "cancelled")
    log.info("task_cancelled", task_id=row["id"])
    return json_response(task_object(await pool.fetchrow(Q.task_by_id, row["id"]), request.app[STORE]))


@routes.post("/api/v1/tasks/{team}/{project}/{name}/retry")
async def retry_task(request: web.Request) -> web.Response:
    """A failed task's failed subtasks run again, each with a fresh budget of attempts; its committed
    results stay (sql/schema/04_tasks.sql, minion_retry_task)."""
    principal = require(request, "user")
    row = await task_row(request, principal)
    pool = request.app[POOL]
    ref = f"{row['team']}/{row['project']}/{row['name']}"
    verdict, subtasks = await pool.fetchrow(Q.retry_task, row["id"])
    if verdict == "missing":
        raise not_found(f"task {ref}")
    if verdict == "not_failed":
        status = (await pool.fetchrow(Q.task_by_id, row["id"]))["status"]
        raise conflict("task_not_failed", f"task {ref} is {status}; only a failed task can be retried"
                       + (" (it has not ended: wait for it)" if status not in FINISHED_TASK_STATUSES else ""))
    if verdict == "nothing_to_retry":
        raise conflict("nothing_to_retry", f"task {ref} failed with no failed subtask to run again "
                                           f"({row['error'] or 'its input could not be split'}); fix its input "
                                           "and submit it again (`minions submit --replace`)")
    log.info("task_retried", task_id=row["id"], subtasks=subtasks)
    return json_response(task_object(await pool.fetchrow(Q.task_by_id, row["id"]), request.app[STORE]))


@routes.post("/api/v1/tasks/{team}/{project}/{name}/verify")
async def verify_task(request: web.Request) -> web.Response:
    """A finished task's results run again by others as a task of their own (sql/schema/11_checks.sql): those that came
    from an executor quarantined since (or every one, `"all": true`). The caller compares the two
    tasks' results by record id (`minions verify`)."""
    principal = require(request, "user")
    row = await task_row(request, principal)
    body = await json_object(request, optional=True, limit=4096)
    unknown = sorted(set(body) - {"all", "name"})
    every = body.get("all", False)
    name = body.get("name", f"{row['name'][:48]}-verify-{secrets.token_hex(3)}")
    errors = {**{k: "unknown field" for k in unknown},
              **({"all": "must be true or false"} if not isinstance(every, bool) else {}),
              **({"name": NAME_RULE} if not isinstance(name, str) or not is_name(name) else {})}
    if errors:
        raise invalid(errors)
    if row["status"] not in FINISHED_TASK_STATUSES:
        raise conflict("task_not_finished", f"task is {row['status']}: results of an open task are checked as "
                                            "it runs (those of a quarantined executor run again by themselves)")
    pool = request.app[POOL]
    made = await pool.fetchrow(Q.verify_task, row["id"], name, every, principal.token_id)
    if made["subtasks"] == -1:
        raise conflict("task_exists", f"a task named {row['team']}/{row['project']}/{name} exists already")
    task = None
    if made["task_id"] is not None:
        task = task_object(await pool.fetchrow(Q.task_by_id, made["task_id"]), request.app[STORE])
        log.info("task_verification_submitted", task_id=row["id"], verify_task_id=made["task_id"],
                 subtasks=made["subtasks"])
    return json_response({"task": task, "subtasks": made["subtasks"]}, status=201 if task else 200)


@routes.delete("/api/v1/tasks/{team}/{project}/{name}")
async def delete_task(request: web.Request) -> web.Response:
    """A finished task goes, with its subtasks; its input and results are garbage from then on (the
    collector deletes them after the grace period, and the team's input quota gets the room back)."""
    principal = require(request, "user")
    row = await task_row(request, principal)
    verdict = await request.app[POOL].fetchval(Q.delete_task, row["id"])
    if verdict == "not_finished":
        raise conflict("not_finished", f"task is {row['status']}; cancel it first")
    if verdict == "missing":
        raise not_found(f"task {row['team']}/{row['project']}/{row['name']}")
    log.info("task_deleted", task_id=row["id"])
    return json_response({"status": "ok"})


@routes.get("/api/v1/tasks/{team}/{project}/{name}/results")
async def task_results(request: web.Request) -> web.StreamResponse:
    principal = require(request, "user")
    row = await task_row(request, principal)
    if request.query.get("format") == "parts":
        return await _result_parts(request, row)
    if (request.query.get("format") or "jsonl") != "jsonl":  # ?format=npy: vectors as one array
        from minions.services.api.routes import results_npy  # late: it reads this module's results
        return await results_npy.respond(request, row)
    partial = request.query.get("partial", "false").lower() in ("1", "true", "yes")
    if row["finished_at"] is None and not partial:
        raise conflict("not_finished", f"task is {row['status']}; results are ready when it ends "
                                       "(or ask for ?partial=true)")
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    try:
        async for chunk in _result_chunks(request, row):
            await response.write(chunk)
    except (ObjectNotFound, ResultCorrupted):
        # Logged where found. The status line is sent already, so the only honest signal left is to
        # break the stream off: the client sees an incomplete response, never a clean end.
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    return response


async def _result_parts(request: web.Request, task: Any) -> web.Response:
    """`?format=parts`: a compacted task's results as presigned GETs of its parts, in order, each with
    the SHA-256 and size the client checks. Not compacted (yet, or ever: failed and cancelled tasks
    are not): `compacted` false and no parts; the JSONL stream serves the results."""
    if task["finished_at"] is None:
        raise conflict("not_finished", f"task is {task['status']}; results are ready when it ends")
    store = request.app[STORE]
    parts = await request.app[POOL].fetch(Q.result_parts, task["id"])
    urls = await asyncio.gather(*(store.presign_get(store.uri_for(p["key"]), PART_URL_S) for p in parts))
    return json_response({
        "compacted": bool(parts),
        "expires_in_s": int(PART_URL_S),
        "records": sum(p["records"] for p in parts),
        "bytes": sum(p["bytes"] for p in parts),
        "parts": [{"part": p["part"], "url": url, "bytes": p["bytes"], "sha256": p["sha256"].hex(),
                   "records": p["records"], "first_subtask": p["first_subtask"],
                   "last_subtask": p["last_subtask"]} for p, url in zip(parts, urls, strict=True)],
    })


async def _result_chunks(request: web.Request, task: Any) -> AsyncIterator[bytes]:
    """Committed outputs in input order: a compacted task's parts, else a page of subtasks at a time,
    the next few results read ahead while one is sent (bounded memory)."""
    pool, store = request.app[POOL], request.app[STORE]
    parts = await pool.fetch(Q.result_parts, task["id"])
    if parts:
        for part in parts:
            async for chunk in _read_checked(store, store.uri_for(part["key"]),
                                             read_verified(store, store.uri_for(part["key"]), part["bytes"],
                                                           part["sha256"])):
                yield chunk
        return
    pieces = readahead.ordered(_subtask_pages(pool, task), functools.partial(_result_piece, pool, store, task),
                               RESULT_READ_AHEAD)
    async for piece in pieces:
        async for chunk in piece:
            yield chunk
    if task["status"] == "cancelled" and task["input_uri"] is not None:  # (a kept input is split at submit)
        # Cancelled mid-split: the input past the split never became subtasks; its records still
        # get their line, so results hold one line per input record.
        size = await store.size(task["input_uri"])
        if size is not None and task["split_offset"] < size:
            async for line in _error_lines(pool, store, task, task["split_offset"], size, "task cancelled"):
                yield line


async def _subtask_pages(pool: Any, task: Any) -> AsyncIterator[Any]:
    after = -1
    while True:
        page = await pool.fetch(Q.result_subtasks, task["id"], after, RESULT_PAGE)
        for sub in page:
            yield sub
        if len(page) < RESULT_PAGE:
            return
        after = page[-1]["subtask_id"]


async def _result_piece(pool: Any, store: ObjectStore, task: Any, sub: Any) -> AsyncIterator[bytes]:
    """One subtask's share of the results. A small committed result is read (and verified) now, ahead
    of its turn; a large one, error lines and nothing at all are produced at their turn."""
    if sub["state"] == "done":
        chunks = _read_checked(store, committed_uri(store, sub), read_committed(store, sub))
        if sub["result_bytes"] is not None and sub["result_bytes"] <= VERIFY_IN_MEMORY:
            return _each([chunk async for chunk in chunks])
        return chunks
    if sub["state"] in ("failed", "cancelled") and task["finished_at"] is not None:
        reason = sub["last_error"] if sub["state"] == "failed" else "task cancelled"
        return _error_lines(pool, store, task, sub["byte_start"], sub["byte_end"], redact_failure(reason or "failed"))
    return _each([])


async def _each(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _read_checked(store: ObjectStore, uri: str, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks` of a committed result or part, with what went wrong logged."""
    try:
        async for chunk in chunks:
            yield chunk
    except ResultCompacted:
        # A stream begun before the task's compaction, still running a grace period after it (the
        # row's bytes were dropped): the client reads again, from the parts.
        log.warning("result_compacted_meanwhile", uri=uri)
        raise
    except ObjectNotFound:
        # A committed output was removed from the store behind our back: the stream breaks off
        # (the client sees an incomplete response) rather than silently dropping records.
        log.error("committed_output_missing", uri=uri)
        raise
    except ResultCorrupted as exc:
        # Never served: the stream breaks off before any byte of this result is sent.
        log.error("committed_result_corrupted", uri=uri, error=str(exc))
        raise


async def _error_lines(pool: Any, store: ObjectStore, task: Any, start: int, end: int,
                       reason: str) -> AsyncIterator[bytes]:
    """One {"id", "error"} line per input record in bytes [start, end) that produced no result."""
    buffer = b""
    async for chunk in _input_range(pool, store, task, start, end):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                record_id, _ = parse_line(task["kind"], line)
                yield jsoncodec.dumps_line({"id": record_id, "error": reason})
    if buffer.strip():
        record_id, _ = parse_line(task["kind"], buffer)
        yield jsoncodec.dumps_line({"id": record_id, "error": reason})


async def _input_range(pool: Any, store: ObjectStore, task: Any, start: int, end: int) -> AsyncIterator[bytes]:
    """Bytes [start, end) of the task's input: from its object, or its bytes kept in the database."""
    if task["input_uri"] is not None:
        async for chunk in store.read(task["input_uri"], start, end):
            yield chunk
        return
    data = await pool.fetchval(Q.kept_input, task["id"], start, end)
    if data is None:
        raise ObjectNotFound(f"the kept input of task {task['id']}")  # the task went meanwhile
    yield data


@routes.post("/api/v1/inputs")
async def upload_input(request: web.Request) -> web.Response:
    principal = require(request, "user")
    if request.content_type not in ("application/x-ndjson", "application/jsonl", "application/json-lines"):
        raise ApiError(415, "unsupported_media_type", "send JSONL with Content-Type: application/x-ndjson")
    pool, store, settings = request.app[POOL], request.app[STORE], request.app[SETTINGS]
    team = inputs.upload_team(request, principal)
    expected = request.query.get("sha256") or None  # an empty value reads as absent, as everywhere
    if expected is None:
        key = f"inputs/uploads/{uuid.uuid4().hex}.jsonl"
    else:
        # Content-addressed: the same bytes are the same object, so a client that submits the same
        # file twice submits the same input URI (the same task, not a conflict).
        if not SHA256_HEX.fullmatch(expected):
            raise invalid({"sha256": "must be the body's SHA-256: 64 lowercase hex digits"})
        key = f"inputs/sha256/{expected}.jsonl"
        stored = await store.size(store.uri_for(key))
        # Skipped only for a team that may already read them (or an admin, who may read anything):
        # knowing a hash must never be enough to gain another team's input, so anyone else sends the
        # bytes, checked against the hash.
        if stored and (principal.role == "admin" or (
                team is not None and await inputs.may_use(pool, principal, team, store.uri_for(key)))):
            return json_response({"uri": store.uri_for(key), "bytes": stored}, 200)
    cap, over = await inputs.upload_cap(pool, settings, team, request.content_length)
    digest = hashlib.sha256()

    async def body() -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_chunked(1 << 20):
            if expected is not None:
                await asyncio.to_thread(digest.update, chunk)
            yield chunk
        if expected is not None and digest.hexdigest() != expected:
            # Raised inside the stream: the store discards the object instead of committing it.
            raise DigestMismatch(digest.hexdigest())

    try:
        uri, size = await store.put_stream(key, inputs.capped(body(), cap, over))
    except DigestMismatch as exc:
        raise invalid({"sha256": f"does not match the body (its SHA-256 is {exc})"}) from None
    if size == 0:
        await store.delete(uri)
        raise invalid({"body": "empty input: send at least one JSONL record"})
    try:
        await inputs.record_input(pool, settings, uri, team, size, principal.token_id)
    except inputs.TooLarge:
        if expected is None:  # a content-addressed object may be another team's too: gc judges it
            await store.delete(uri)
        raise
    return json_response({"uri": uri, "bytes": size}, 201)
