"""Compaction of a completed task's results into a few large parts, so reading them back is a few
large reads instead of one per subtask.

Results are committed one object per subtask (the verified copies of 070), or, when small, in the
subtask's row (sql/schema/07_results.sql). Reading them back is a round trip per object, an hour for a 200,000-subtask
task on S3. Once a task has completed, its committed results are copied, in subtask order (each
object checked against the SHA-256 recorded at complete; a row's bytes were checked by PostgreSQL
when they were written), into parts of about MINIONS_RESULT_PART_BYTES (`parts/<task>/<part>-<nonce>.jsonl`), each
recorded with its own SHA-256 and size (sql/schema/07_results.sql). Clients then fetch the parts by
presigned GET straight from the store.

Crash safety: a part is written, then recorded; one written but not recorded (a kill -9 between the
two, a lost race) is garbage for `minions gc` (minion_gc_parts). A compaction resumes after the last
recorded part. Per-subtask objects become garbage only once minion_finish_compaction has seen every
subtask covered. One compactor per task at a time (a session advisory lock, which a killed
compactor's connection takes with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from minions import readahead
from minions.committed_results import VERIFY_IN_MEMORY, read_committed
from minions.db.gateways.compact import CompactGateway
from minions.logging import get_logger
from minions.store.base import ObjectStore, StoreError

log = get_logger(__name__)
PAGE = 1000  # subtasks read from the database at a time
READ_AHEAD = 32  # committed results read from the store at once (each at most VERIFY_IN_MEMORY)
HASH_IN_THREAD = 256 * 1024  # smaller chunks are hashed on the loop: a thread hop costs more


@dataclass
class Compaction:
    task_id: int
    parts: int = 0  # parts this run recorded
    bytes: int = 0
    subtasks: int = 0
    done: bool = False  # the task is compacted (by this run or before)


Progress = Callable[[Compaction], None]


def part_key(task_id: int, part: int) -> str:
    # A nonce per write: two compactors (or a restarted one) never write one object.
    return f"parts/{task_id}/{part}-{secrets.token_hex(8)}.jsonl"


class Compactor:
    def __init__(self, conn: asyncpg.Connection, store: ObjectStore, *, part_bytes: int,
                 progress: Progress | None = None) -> None:
        self.db = CompactGateway(conn)  # one connection: a task's lock is a session lock
        self.store = store
        self.part_bytes = part_bytes
        self._progress = progress or (lambda _c: None)

    async def compact(self, task_id: int) -> Compaction:
        """Compact one completed task (resuming after its recorded parts). `done` is False when
        another compactor holds the task, or it is not a completed task."""
        report = Compaction(task_id)
        if not await self.db.try_lock_task(task_id=task_id):
            return report
        try:
            last = await self.db.last_part(task_id=task_id)
            part = 0 if last is None else last["part"] + 1
            after = -1 if last is None else last["last_subtask"]
            results = readahead.ordered(self._done_subtasks(task_id, after), self._prefetch, READ_AHEAD)
            async with contextlib.aclosing(results):  # its reads ahead end with the compaction
                return await self._compact_from(report, part, results)
        finally:
            await self.db.unlock_task(task_id=task_id)

    async def _compact_from(self, report: Compaction, part: int,
                            results: AsyncIterator[tuple[Any, list[bytes] | None]]) -> Compaction:
        task_id = report.task_id
        pending: tuple[Any, list[bytes] | None] | None = await anext(results, None)
        while pending is not None:
            written = await self._write_part(task_id, part, pending, results)
            key, first, last_sub, digest, size, records, pending = written
            if not await self.db.record_part(task_id=task_id, part=part, first_subtask=first, last_subtask=last_sub,
                                             key=key, sha256=digest, size=size, records=records):
                # Not the next part of a completed task any more (deleted meanwhile): ours is garbage.
                log.warning("result_part_refused", task_id=task_id, part=part, key=key)
                await _discard(self.store, key)
                return report
            log.info("result_part_recorded", task_id=task_id, part=part, subtasks=f"{first}-{last_sub}",
                     bytes=size)
            report.parts += 1
            report.bytes += size
            report.subtasks += last_sub - first + 1
            self._progress(report)
            part += 1
        report.done = await self.db.finish_compaction(task_id=task_id)
        if report.done:
            log.info("task_compacted", task_id=task_id, parts=report.parts, bytes=report.bytes)
        return report

    async def _done_subtasks(self, task_id: int, after: int) -> AsyncIterator[Any]:
        while True:
            page = await self.db.done_subtasks(task_id=task_id, after=after, limit=PAGE)
            for sub in page:
                yield sub
            if len(page) < PAGE:
                return
            after = page[-1]["subtask_id"]

    async def _prefetch(self, sub: Any) -> tuple[Any, list[bytes] | None]:
        """A small result read (and verified) ahead; a large one is streamed at its turn (None)."""
        if sub["result_bytes"] is not None and sub["result_bytes"] > VERIFY_IN_MEMORY:
            return sub, None
        return sub, [chunk async for chunk in read_committed(self.store, sub)]

    async def _write_part(self, task_id: int, part: int, head: tuple[Any, list[bytes] | None],
                          results: AsyncIterator[tuple[Any, list[bytes] | None]],
                          ) -> tuple[str, int, int, bytes, int, int, tuple[Any, list[bytes] | None] | None]:
        """Write one part from `head` on, until it holds at least part_bytes; returns its key, first
        and last subtask, SHA-256, size, records and the first result it did not take."""
        key = part_key(task_id, part)
        digest = hashlib.sha256()
        size = records = 0
        first = last = head[0]["subtask_id"]
        nxt: tuple[Any, list[bytes] | None] | None = head

        async def body() -> AsyncIterator[bytes]:
            nonlocal size, records, last, nxt
            while nxt is not None and size < self.part_bytes:  # at least one subtask: part_bytes > 0
                sub, chunks = nxt
                source = read_committed(self.store, sub) if chunks is None else _each(chunks)
                async for chunk in source:
                    if len(chunk) >= HASH_IN_THREAD:
                        await asyncio.to_thread(digest.update, chunk)
                    else:
                        digest.update(chunk)
                    size += len(chunk)
                    yield chunk
                records += sub["records"]
                last = sub["subtask_id"]
                nxt = await anext(results, None)

        try:
            await self.store.put_stream(key, body())
        except BaseException:
            await _discard(self.store, key)
            raise
        return key, first, last, digest.digest(), size, records, nxt


async def _each(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _discard(store: ObjectStore, key: str) -> None:
    """Best effort: what is left is garbage the collector removes anyway."""
    try:
        await store.delete(store.uri_for(key))
    except StoreError as exc:
        log.warning("result_part_discard_failed", key=key, error=str(exc))


async def compact_completed(conn: asyncpg.Connection, store: ObjectStore, *, part_bytes: int, limit: int = 10,
                            progress: Progress | None = None) -> list[Compaction]:
    """Compact up to `limit` completed tasks that are not compacted yet."""
    compactor = Compactor(conn, store, part_bytes=part_bytes, progress=progress)
    return [await compactor.compact(task_id) for task_id in await compactor.db.tasks_to_compact(limit=limit)]
