"""Splitting one task: stream its input once, cut it into subtasks, insert them in batches.

The caller holds the task's advisory lock. Every step that changes state is one SQL function
(sql/schema/04_tasks.sql): a crash anywhere leaves a task that the next splitter resumes, never one that
is half-inserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Literal

import asyncpg

from minions.kinds import FINISHED_TASK_STATUSES
from minions.logging import get_logger
from minions.services.splitter.gateway import SplitStart, SplitTask, SplitterGateway
from minions.store.base import ObjectNotFound, ObjectStore, StoreError
from minions.subtask_cutter import Cutter, IdFinder, InputError, Subtask

Outcome = Literal["done", "failed", "cancelled", "skipped", "retry"]

# Subtasks go to the database in batches: large enough that a big split is not one round trip per
# subtask, frequent enough that executors can claim the first ones long before the split ends.
BATCH_SUBTASKS = 200
BATCH_INTERVAL_S = 0.5
# With no batch to insert for this long (huge subtasks), look whether the task was cancelled.
CANCEL_CHECK_S = 5.0


class StoreUnavailable(Exception):
    """Reading the input failed for a reason that may pass (network, throttling): retry later."""


@dataclass
class SplitResult:
    outcome: Outcome
    subtasks: int = 0  # subtasks this run inserted
    records: int = 0  # records in the input read so far
    bytes: int = 0  # bytes of input read so far
    error: str | None = None


async def split_task(
    conn: asyncpg.Connection,
    store: ObjectStore,
    task_id: int,
    *,
    batch_subtasks: int = BATCH_SUBTASKS,
    batch_interval_s: float = BATCH_INTERVAL_S,
    cancel_check_s: float = CANCEL_CHECK_S,
) -> SplitResult:
    """Split (or resume splitting) one task, on the connection that holds its lock. Database errors
    propagate (the caller reconnects and the next run resumes from the last inserted batch); input
    errors fail the task."""
    db = SplitterGateway(conn)
    begun = await db.begin_split(task_id=task_id)
    if begun is None:
        return SplitResult("skipped")
    task = await db.task_for_split(task_id=task_id)
    assert task is not None  # begin_split just updated it
    split = TaskSplit(db, store, task_id, task, begun, batch_subtasks=batch_subtasks,
                      batch_interval_s=batch_interval_s, cancel_check_s=cancel_check_s)
    return await split.run()


class TaskSplit:
    """One run of one task's split, begun (minion_begin_split) where the last run stopped: streams
    the input, cuts it, keeps the subtasks the last run had not inserted, and inserts them in
    batches."""

    def __init__(self, db: SplitterGateway, store: ObjectStore, task_id: int, task: SplitTask,
                 begun: SplitStart, *, batch_subtasks: int, batch_interval_s: float,
                 cancel_check_s: float) -> None:
        self.db = db
        self.store = store
        self.task_id = task_id
        self.uri: str = task["input_uri"]
        self.resume_offset: int = begun["split_offset"]
        self.resume_records: int = begun["split_records"]
        self.batch_subtasks = batch_subtasks
        self.batch_interval_s = batch_interval_s
        self.cancel_check_s = cancel_check_s
        self.cutter = Cutter(task["kind"], task["subtask_size"])
        self.pending: list[Subtask] = []  # cut, not yet inserted
        self.next_subtask_id: int = begun["next_subtask_id"]
        self.inserted = 0  # subtasks this run inserted
        self.flushed_once = False
        self.started = self.last_db = time.monotonic()  # last_db: the last round trip to the database
        self.log = get_logger("splitter").bind(task_id=task_id)

    async def run(self) -> SplitResult:
        if self.resume_offset:
            self.log.info("split_resuming", offset=self.resume_offset, records=self.resume_records)
        try:
            if not await self._insert_all():
                self.log.info("split_stopped", reason="task no longer splittable")
                return self._result("cancelled")
        except InputError as exc:
            error = await self._explain(exc)
        except ObjectNotFound:
            error = f"input {self.uri} not found"
        except StoreUnavailable as exc:
            self.log.warning("input_unreadable", error=str(exc))
            return self._result("retry", str(exc))
        else:
            await self.db.finish_split(task_id=self.task_id)
            elapsed = max(time.monotonic() - self.started, 1e-9)
            self.log.info(
                "split_done", subtasks=self.inserted, records=self.cutter.records, bytes=self.cutter.offset,
                seconds=round(elapsed, 3), mb_per_s=round(self.cutter.offset / elapsed / 1e6, 2),
            )
            return self._result("done")
        await self.db.fail_split(task_id=self.task_id, error=error)
        self.log.info("split_failed", reason="bad input", error=error)
        # minion_fail_split deleted whatever subtasks this or an earlier run inserted.
        return SplitResult("failed", 0, self.cutter.records, self.cutter.offset, error)

    def _result(self, outcome: Outcome, error: str | None = None) -> SplitResult:
        return SplitResult(outcome, self.inserted, self.cutter.records, self.cutter.offset, error)

    async def _insert_all(self) -> bool:
        """Reads the whole input and inserts every subtask; False once the task is no longer
        splittable (cancelled, failed)."""
        if not self.store.readable(self.uri):
            raise InputError(f"input {self.uri} is not in the configured object store")
        async with contextlib.aclosing(_read(self.store, self.uri)) as chunks:
            async for chunk in chunks:
                self._keep(self.cutter.feed(chunk))
                if not await self._insert_due():
                    return False
                # Cutting is CPU work: let the listener and other splits run between chunks.
                await asyncio.sleep(0)
        self._keep(self.cutter.finish())
        if self.cutter.offset < self.resume_offset:
            raise InputError("the input object changed after its split began")
        while self.pending:
            if not await self._flush():
                return False
        return True

    async def _insert_due(self) -> bool:
        """Inserts the batches that are due; with nothing to insert for a while, checks the task is
        still splittable. False when it is not."""
        now = time.monotonic()
        # The first subtasks go out at once (sub-second start), later ones in batches.
        while len(self.pending) >= self.batch_subtasks or (
            self.pending and (not self.flushed_once or now - self.last_db >= self.batch_interval_s)
        ):
            if not await self._flush():
                return False
        if not self.pending and now - self.last_db >= self.cancel_check_s:
            return await self._still_splittable()
        return True

    def _keep(self, subtasks: list[Subtask]) -> None:
        for subtask in subtasks:
            if subtask.byte_end <= self.resume_offset:
                continue  # inserted by the run that crashed; read again only to know its ids
            if subtask.byte_start < self.resume_offset or (
                subtask.byte_start == self.resume_offset and subtask.first_record != self.resume_records
            ):
                raise InputError("the input object changed after its split began")
            self.pending.append(subtask)

    async def _flush(self) -> bool:
        """Inserts the next batch; False when the task is no longer splittable."""
        items, self.pending = self.pending[: self.batch_subtasks], self.pending[self.batch_subtasks:]
        last = items[-1]
        added = await self.db.add_subtasks(
            task_id=self.task_id,
            byte_starts=[s.byte_start for s in items],
            byte_ends=[s.byte_end for s in items],
            first_records=[s.first_record for s in items],
            records=[s.records for s in items],
            first_subtask_id=self.next_subtask_id,
            split_offset=last.byte_end,
            split_records=last.first_record + last.records,
        )
        self.last_db = time.monotonic()
        if not added:
            return False
        self.next_subtask_id += len(items)
        self.inserted += len(items)
        self.flushed_once = True
        elapsed = max(self.last_db - self.started, 1e-9)
        self.log.info(
            "split_progress", subtasks=self.inserted, records=last.first_record + last.records,
            bytes=self.cutter.offset, mb_per_s=round(self.cutter.offset / elapsed / 1e6, 2),
        )
        return True

    async def _still_splittable(self) -> bool:
        row = await self.db.task_status(task_id=self.task_id)
        self.last_db = time.monotonic()
        # Not a status test: the first claim makes a task "running" while it is still splitting.
        return row is not None and row["status"] not in FINISHED_TASK_STATUSES and not row["split_done"]

    async def _explain(self, exc: InputError) -> str:
        """The input error as the task will show it: for a duplicate id, where it first appeared."""
        error = str(exc)
        if exc.duplicate_id is not None:
            first = await _first_line_of(self.store, self.uri, exc.duplicate_id)
            if first is not None and first != exc.line:
                error += f" (first seen on line {first})"
        return error


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
