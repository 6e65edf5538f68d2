"""Splitting one task: stream its input once, cut it into subtasks, insert them in batches.

The caller holds the task's advisory lock. Every step that changes state is one SQL function
(sql/020_tasks.sql): a crash anywhere leaves a task that the next splitter resumes, never one that
is half-inserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal

import asyncpg

from minions.db.queries import Queries
from minions.logging import get_logger
from minions.services.splitter.cutter import Cutter, IdFinder, InputError, Subtask
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

Q = Queries("splitter")

Outcome = Literal["done", "failed", "cancelled", "skipped", "retry"]

# Subtasks go to the database in batches: large enough that a big split is not one round trip per
# subtask, frequent enough that executors can claim the first ones long before the split ends.
BATCH_SUBTASKS = 200
BATCH_INTERVAL_S = 0.5
# With no batch to insert for this long (huge subtasks), look whether the task was cancelled.
CANCEL_CHECK_S = 5.0

FINISHED = ("completed", "failed", "cancelled")


class StoreUnavailable(Exception):
    """Reading the input failed for a reason that may pass (network, throttling): retry later."""


@dataclass
class SplitResult:
    outcome: Outcome
    subtasks: int = 0  # subtasks this run inserted
    records: int = 0  # records in the input read so far
    bytes: int = 0  # bytes of input read so far
    error: str | None = None


@dataclass
class _Batch:
    """Subtasks cut but not yet inserted."""

    next_subtask_id: int
    items: list[Subtask] = field(default_factory=list)


async def split_task(
    conn: asyncpg.Connection,
    store: ObjectStore,
    task_id: int,
    *,
    batch_subtasks: int = BATCH_SUBTASKS,
    batch_interval_s: float = BATCH_INTERVAL_S,
    cancel_check_s: float = CANCEL_CHECK_S,
) -> SplitResult:
    """Split (or resume splitting) one task. Database errors propagate (the caller reconnects and
    the next run resumes from the last inserted batch); input errors fail the task."""
    log = get_logger("splitter").bind(task_id=task_id)
    begun = await conn.fetchrow(Q.begin_split, task_id)
    if begun is None or begun["split_offset"] is None:
        return SplitResult("skipped")
    task = await conn.fetchrow(Q.task_for_split, task_id)
    assert task is not None  # begin_split just updated it
    uri: str = task["input_uri"]
    resume_offset: int = begun["split_offset"]
    resume_records: int = begun["split_records"]
    if resume_offset:
        log.info("split_resuming", offset=resume_offset, records=resume_records)

    cutter = Cutter(task["kind"], task["subtask_size"])
    batch = _Batch(begun["next_subtask_id"])
    inserted = 0
    started = last_db = time.monotonic()
    first_flush_done = False

    def result(outcome: Outcome, error: str | None = None) -> SplitResult:
        return SplitResult(outcome, inserted, cutter.records, cutter.offset, error)

    def keep(subtasks: list[Subtask]) -> None:
        for subtask in subtasks:
            if subtask.byte_end <= resume_offset:
                continue  # inserted by the run that crashed; read again only to know its ids
            if subtask.byte_start < resume_offset or (
                subtask.byte_start == resume_offset and subtask.first_record != resume_records
            ):
                raise InputError("the input object changed after its split began")
            batch.items.append(subtask)

    async def flush(count: int) -> bool:
        nonlocal inserted, last_db, first_flush_done
        items, batch.items = batch.items[:count], batch.items[count:]
        last = items[-1]
        added = await conn.fetchval(
            Q.add_subtasks,
            task_id,
            [s.byte_start for s in items],
            [s.byte_end for s in items],
            [s.first_record for s in items],
            [s.records for s in items],
            batch.next_subtask_id,
            last.byte_end,
            last.first_record + last.records,
        )
        last_db = time.monotonic()
        if not added:
            return False
        batch.next_subtask_id += len(items)
        inserted += len(items)
        first_flush_done = True
        elapsed = max(last_db - started, 1e-9)
        log.info(
            "split_progress", subtasks=inserted, records=last.first_record + last.records,
            bytes=cutter.offset, mb_per_s=round(cutter.offset / elapsed / 1e6, 2),
        )
        return True

    async def still_splittable() -> bool:
        nonlocal last_db
        row = await conn.fetchrow(Q.task_status, task_id)
        last_db = time.monotonic()
        # Not a status test: the first claim makes a task "running" while it is still splitting.
        return row is not None and row["status"] not in FINISHED and not row["split_done"]

    try:
        if not store.readable(uri):
            raise InputError(f"input {uri} is not in the configured object store")
        async with contextlib.aclosing(_read(store, uri)) as chunks:
            async for chunk in chunks:
                keep(cutter.feed(chunk))
                now = time.monotonic()
                # The first subtasks go out at once (sub-second start), later ones in batches.
                while len(batch.items) >= batch_subtasks or (
                    batch.items and (not first_flush_done or now - last_db >= batch_interval_s)
                ):
                    if not await flush(batch_subtasks):
                        log.info("split_stopped", reason="task no longer splittable")
                        return result("cancelled")
                if not batch.items and now - last_db >= cancel_check_s and not await still_splittable():
                    log.info("split_stopped", reason="task no longer splittable")
                    return result("cancelled")
                # Cutting is CPU work: let the listener and other splits run between chunks.
                await asyncio.sleep(0)
        keep(cutter.finish())
        if cutter.offset < resume_offset:
            raise InputError("the input object changed after its split began")
        while batch.items:
            if not await flush(batch_subtasks):
                log.info("split_stopped", reason="task no longer splittable")
                return result("cancelled")
    except InputError as exc:
        error = str(exc)
        if exc.duplicate_id is not None:
            first = await _first_line_of(store, uri, exc.duplicate_id)
            if first is not None and first != exc.line:
                error += f" (first seen on line {first})"
    except ObjectNotFound:
        error = f"input {uri} not found"
    except StoreUnavailable as exc:
        log.warning("input_unreadable", error=str(exc))
        return result("retry", str(exc))
    else:
        await conn.execute(Q.finish_split, task_id)
        elapsed = max(time.monotonic() - started, 1e-9)
        log.info(
            "split_done", subtasks=inserted, records=cutter.records, bytes=cutter.offset,
            seconds=round(elapsed, 3), mb_per_s=round(cutter.offset / elapsed / 1e6, 2),
        )
        return result("done")
    await fail_task(conn, task_id, error)
    log.info("split_failed", reason="bad input", error=error)
    # minion_fail_split deleted whatever subtasks this or an earlier run inserted.
    return SplitResult("failed", 0, cutter.records, cutter.offset, error)


async def fail_task(conn: asyncpg.Connection, task_id: int, error: str) -> None:
    """Fail a task's split: its subtasks are deleted, the task is failed with `error`."""
    await conn.execute(Q.fail_split, task_id, error)


async def _read(store: ObjectStore, uri: str, start: int = 0) -> AsyncGenerator[bytes, None]:
    """The object's bytes from `start`, with store trouble told apart from database trouble (both
    can be OSErrors): a missing object fails the task, anything else the store raises is retried."""
    chunks = store.read(uri, start)
    try:
        async for chunk in chunks:
            yield chunk
    except ObjectNotFound:
        raise
    except (StoreError, OSError, TimeoutError) as exc:
        raise StoreUnavailable(f"reading {uri}: {exc}") from exc
    finally:
        # Stopping early (bad line, cancelled task) must close the store's stream at once, not
        # whenever the garbage collector gets to it.
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _first_line_of(store: ObjectStore, uri: str, record_id: object) -> int | None:
    """The line where `record_id` first appears (for a duplicate's error), or None if the input
    cannot be read again."""
    finder = IdFinder(record_id)
    try:
        async with contextlib.aclosing(_read(store, uri)) as chunks:
            async for chunk in chunks:
                if finder.feed(chunk):
                    return finder.found
                await asyncio.sleep(0)
    except (StoreError, StoreUnavailable, InputError):
        return None
    return finder.finish()
