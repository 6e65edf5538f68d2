"""Garbage collection of the object store, so space held by nothing comes back: `minions gc` and the
watchdog's sweep.

Garbage, once older than the grace period:
- inputs no task reads: their ownership records first (the SQL function deletes them under a row
  lock, so a submission naming one at the same moment either keeps it or is refused), then every
  object under `inputs/` that nobody owns and no task reads;
- outputs under `outputs/` of tasks that no longer exist, and attempts that are neither the committed
  result nor a live lease's; committed results under `results/` (the verified copies) of deleted
  tasks, and copies no subtask names; both once their task's results are compacted into parts;
- result parts under `parts/` that no row records (a compaction killed or beaten before recording);
- small results kept in the database (sql/schema/07_results.sql) of tasks compacted that long ago: their rows' bytes;
- partial writes: temp files a killed API left (local store), unfinished multipart uploads (S3).
The database decides what is garbage; this module only lists the store and deletes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import asyncpg

from minions.db.connect import connect
from minions.db.gateways.gc import GcGateway
from minions.logging import get_logger
from minions.store.base import InvalidKey, ListedObject, ObjectStore, StoreError
from minions.store.factory import open_store

log = get_logger(__name__)
BATCH = 500
DRY_RUN_RECORDS = 1_000_000  # a dry run deletes nothing, so it cannot page: one large look


@dataclass
class Tally:
    objects: int = 0
    bytes: int = 0

    def add(self, size: int) -> None:
        self.objects += 1
        self.bytes += size


@dataclass
class GcReport:
    dry_run: bool
    scanned: int = 0
    inputs: Tally = field(default_factory=Tally)
    outputs: Tally = field(default_factory=Tally)
    partials: Tally = field(default_factory=Tally)
    kept: Tally = field(default_factory=Tally)  # results kept in rows whose bytes were dropped
    errors: int = 0

    @property
    def freed_bytes(self) -> int:
        return self.inputs.bytes + self.outputs.bytes + self.partials.bytes

    def summary(self) -> str:
        verb = "would free" if self.dry_run else "freed"
        return (f"scanned {self.scanned:,} objects; {verb} {self.freed_bytes:,} bytes: "
                f"{self.inputs.objects:,} inputs ({self.inputs.bytes:,} B), "
                f"{self.outputs.objects:,} outputs ({self.outputs.bytes:,} B), "
                f"{self.partials.objects:,} partial writes ({self.partials.bytes:,} B)"
                + (f"; {'would drop' if self.dry_run else 'dropped'} {self.kept.objects:,} compacted results kept "
                   f"in the database ({self.kept.bytes:,} B)" if self.kept.objects else "")
                + (f"; {self.errors} could not be deleted (logged)" if self.errors else ""))


Progress = Callable[[str, GcReport], None]


class KeyJudge(Protocol):
    """A gateway method that names the garbage among a batch of listed keys."""

    async def __call__(self, *, keys: list[str]) -> list[str]: ...


class Collector:
    def __init__(self, conn: asyncpg.Connection, store: ObjectStore, *, grace_s: float, dry_run: bool,
                 progress: Progress | None = None) -> None:
        self.db = GcGateway(conn)
        self.store = store
        self.grace_s = grace_s
        self.report = GcReport(dry_run)
        self._progress = progress or (lambda _phase, _report: None)
        self._now = time.time()

    async def run(self) -> GcReport:
        await self._stale_records()
        await self._walk("inputs/", self._unowned_inputs)
        await self._walk("outputs/", self._garbage_outputs)
        await self._walk("results/", self._garbage_results)
        await self._walk("parts/", self._garbage_parts)
        await self._kept_results()
        self._progress("done", self.report)
        return self.report

    async def _stale_records(self) -> None:
        limit = DRY_RUN_RECORDS if self.report.dry_run else BATCH
        while True:
            rows = await self.db.stale_input_records(grace_s=self.grace_s, dry_run=self.report.dry_run, limit=limit)
            for row in rows:
                await self._delete_uri(row["uri"], row["bytes"])
            self._progress("input records", self.report)
            if self.report.dry_run or not rows:
                return

    async def _kept_results(self) -> None:
        while True:
            rows = await self.db.kept_results(grace_s=self.grace_s, dry_run=self.report.dry_run, limit=BATCH)
            for row in rows:
                self.report.kept.objects += row["subtasks"]
                self.report.kept.bytes += row["bytes"]
            self._progress("kept results", self.report)
            if self.report.dry_run or not rows:
                return

    async def _walk(self, prefix: str, judge: Callable[[list[ListedObject]], Awaitable[None]]) -> None:
        batch: list[ListedObject] = []
        async for found in self.store.scan(prefix):
            self.report.scanned += 1
            if self._now - found.modified < self.grace_s:
                continue
            if found.partial:
                await self._remove(found, self.report.partials)
                continue
            batch.append(found)
            if len(batch) >= BATCH:
                await judge(batch)
                batch = []
                self._progress(prefix, self.report)
        if batch:
            await judge(batch)
        self._progress(prefix, self.report)

    async def _unowned_inputs(self, batch: list[ListedObject]) -> None:
        by_uri = {}
        for found in batch:
            try:
                by_uri[self.store.uri_for(found.key)] = found
            except InvalidKey:  # a file no key of ours names (put there by hand): not ours to judge
                continue
        for uri in await self.db.unowned_inputs(uris=list(by_uri)):
            await self._remove(by_uri[uri], self.report.inputs)

    async def _garbage_outputs(self, batch: list[ListedObject]) -> None:
        await self._judge_keys(self.db.garbage_outputs, batch)

    async def _garbage_results(self, batch: list[ListedObject]) -> None:
        await self._judge_keys(self.db.garbage_results, batch)

    async def _garbage_parts(self, batch: list[ListedObject]) -> None:
        await self._judge_keys(self.db.garbage_parts, batch)

    async def _judge_keys(self, judge: KeyJudge, batch: list[ListedObject]) -> None:
        by_key = {found.key: found for found in batch}
        for key in await judge(keys=list(by_key)):
            await self._remove(by_key[key], self.report.outputs)

    async def _delete_uri(self, uri: str, size: int) -> None:
        if not self.store.readable(uri):
            return  # recorded under another store root (the store moved): not ours to delete
        self.report.inputs.add(size)
        if self.report.dry_run:
            return
        try:
            await self.store.delete(uri)
        except StoreError as exc:
            self.report.errors += 1
            log.warning("gc_delete_failed", uri=uri, error=str(exc))

    async def _remove(self, found: ListedObject, tally: Tally) -> None:
        tally.add(found.size)
        if self.report.dry_run:
            return
        try:
            await self.store.remove(found)
        except StoreError as exc:
            self.report.errors += 1
            log.warning("gc_delete_failed", key=found.key, error=str(exc))


async def collect_garbage(conn: asyncpg.Connection, store: ObjectStore, *, grace_s: float, dry_run: bool = False,
                          progress: Progress | None = None) -> GcReport:
    """One garbage collection of `store`; what it found (and, unless `dry_run`, deleted)."""
    return await Collector(conn, store, grace_s=grace_s, dry_run=dry_run, progress=progress).run()


@asynccontextmanager
async def connected_store(database_url: str, store_uri: str,
                          s3_endpoint_url: str = "") -> AsyncIterator[tuple[asyncpg.Connection, ObjectStore]]:
    """A connection and the configured store (to read, list and delete: no URL is signed here), both
    closed after."""
    conn = await connect(database_url)
    try:
        store = open_store(store_uri, s3_endpoint_url=s3_endpoint_url)
        try:
            yield conn, store
        finally:
            await store.close()
    finally:
        await conn.close()
