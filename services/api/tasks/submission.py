"""Submitting a task: one call of minion_submit_task (sql/schema/04_tasks.sql) creates it, with the
subtasks of a small inline task cut here and its records when they are kept in the database; larger
inline records go to the store first (recorded against the team's input quota before they are
written), and an input URI is checked against what the team may read. The same body again is the
same task (idempotent); the team's priority cap is judged before anything is written."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

import asyncpg

from minions.logging import get_logger
from minions.services.api.context import Context
from minions.services.api.gateway import RequestHashRow, SplitArrays, TaskRow
from minions.services.api.http.auth import Principal
from minions.services.api.http.errors import conflict, forbidden, invalid
from minions.services.api.inputs import rules as inputs
from minions.services.api.tasks.inline_records import SpooledRecords
from minions.services.api.tasks.inline_split import SplitRanges, cut_small
from minions.services.api.tasks.priority_cap import capped, refused_above_cap
from minions.services.api.tasks.validation import TaskRequest
from minions.store.base import StoreError

log = get_logger(__name__)
CUT_ON_LOOP = 16 * 1024  # inline records up to this are split on the event loop


async def submit(ctx: Context, principal: Principal, task: TaskRequest) -> tuple[TaskRow, bool]:
    """The task submitted (created: True), or the same body's task again (False); a different body
    under its name is 409 task_exists."""
    if not principal.can_see_team(task.team):
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    gateway, store = ctx.gateway, ctx.store

    ranges = await _small_split(ctx, task)
    input_uri = None
    if ranges is None or ranges.kept is None:
        # Judged before an input object is written for it (and again by the submission itself,
        # should an admin lower the cap meanwhile). A small task's submission alone judges it.
        await _judge_cap(ctx, principal, task)
        # An input object: not written for a re-submission of an existing task.
        existing = await gateway.task_request_hash(team=task.team, project=task.project, name=task.name)
        if existing is not None:
            return await _resubmitted(ctx, task, existing), False
        input_uri = await _store_input(ctx, principal, task)
    # One function call: the task, the subtasks of a small one, and its records when they are kept in
    # the database (sql/schema/04_tasks.sql, sql/schema/08_inputs.sql).
    split = SplitArrays(starts=None, ends=None, first_records=None, records=None) if ranges is None else \
        SplitArrays(starts=ranges.byte_starts, ends=ranges.byte_ends, first_records=ranges.first_records,
                    records=ranges.records)
    quota = ctx.settings.team_input_quota_bytes
    try:
        # The team's priority cap is read by this very statement (a user's priority above it: 403,
        # nothing committed), so the common submission stays one round trip.
        with refused_above_cap(task.team, task.priority):
            row = await gateway.submit_task(
                team=task.team, project=task.project, name=task.name, kind=task.kind, model=task.model,
                params=task.params, priority=task.priority, subtask_size=task.subtask_size, input_uri=input_uri,
                request_hash=task.request_hash, token_id=principal.token_id, split=split,
                kept_records=None if ranges is None else ranges.kept, input_quota=quota, capped=capped(principal),
                placement=task.placement)
    except asyncpg.ConfigurationLimitExceededError:  # a kept input past the team's quota: nothing committed
        raise inputs.quota_exceeded(task.team, await gateway.team_input_bytes(team=task.team), quota) from None
    if row is None:  # the name is taken (or was, in a race): answered like a re-submission
        existing = await gateway.task_request_hash(team=task.team, project=task.project, name=task.name)
        assert existing is not None  # tasks are deleted only once finished, never a moment after submission
        if input_uri is not None and task.records is not None and existing["request_hash"] != task.request_hash:
            # Only a different body's input is ours alone to remove: an identical body wrote the very
            # object (keyed by its hash) that the winning task reads.
            await store.delete(input_uri)
        return await _resubmitted(ctx, task, existing), False
    if ranges is not None:
        # Split here: its subtasks are claimable now. This process's waiting claims start at once,
        # not a NOTIFY's round trip later (the NOTIFY still wakes those of every API process).
        ctx.waiters.wake(row["capability"])
    log.info("task_submitted", task=f"{task.team}/{task.project}/{task.name}", kind=task.kind,
             model=task.model, split_at_submit=ranges is not None, input_kept=input_uri is None)
    return row, True


async def judge(ctx: Context, principal: Principal, task: TaskRequest) -> None:
    """`?dry_run=true`: every check a submission makes before it creates anything (the fields and
    records, the team's scope, the priority cap), and nothing created: `submit --replace` asks this
    before it deletes the task the new one replaces, so a refused body leaves the old one."""
    if not principal.can_see_team(task.team):
        raise forbidden(f"your token is scoped to team {principal.team}", "wrong_team")
    await _judge_cap(ctx, principal, task)


async def _judge_cap(ctx: Context, principal: Principal, task: TaskRequest) -> None:
    """A user's task judged by the team's cap and existence (403 priority_above_cap / unknown_team),
    before anything of it is written; an admin's is not held to them."""
    if capped(principal):
        with refused_above_cap(task.team, task.priority):
            await ctx.gateway.priority_within_cap(team=task.team, priority=task.priority, capped=True)


async def _small_split(ctx: Context, task: TaskRequest) -> SplitRanges | None:
    """The subtasks of small inline records, cut here (services/api/tasks/inline_split.py), with the
    records themselves when they are kept in the database; None leaves the split to the splitter."""
    settings = ctx.settings
    limit = settings.inline_split_max_bytes
    if task.records is None or task.records.size > limit:
        return None
    cut = functools.partial(cut_small, task.records, task.kind, task.subtask_size, limit,
                            settings.input_in_database_bytes)
    # A few KiB of records are cut on the loop (as they were validated there): a thread's round trip
    # would cost more than the work.
    return cut() if task.records.size <= CUT_ON_LOOP else await asyncio.to_thread(cut)


async def _resubmitted(ctx: Context, task: TaskRequest, existing: RequestHashRow) -> TaskRow:
    """Idempotent submission: the same body again returns the task; a different one is a conflict."""
    if existing["request_hash"] != task.request_hash:
        raise conflict("task_exists",
                       f"task {task.team}/{task.project}/{task.name} exists with a different definition: submit "
                       "under another name; if it failed, retry it (POST …/retry, `minions retry`); or delete it "
                       "first, its results with it (`minions submit --replace` does)")
    row = await ctx.gateway.task_by_id(task_id=existing["id"])
    assert row is not None  # a task goes only once it ended, and by its owner's hand
    return row


async def _store_input(ctx: Context, principal: Principal, task: TaskRequest) -> str:
    gateway, store, settings = ctx.gateway, ctx.store, ctx.settings
    if task.records is not None:
        key = f"inputs/{task.team}/{task.project}/{task.name}-{task.request_hash[:16]}.jsonl"
        # Recorded (within the team's quota) before it is written: a crash in between leaves a
        # record the garbage collector removes, never an object nobody accounts for.
        await inputs.record_input(gateway, settings, store.uri_for(key), task.team, task.records.size,
                                  principal.token_id)
        uri, _ = await store.put_stream(key, _spooled_chunks(task.records))
        return uri
    assert task.input_uri is not None
    # Scoped to the submitter's team: before anything is read or created.
    await inputs.check_input_use(gateway, principal, task.team, task.input_uri)
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
