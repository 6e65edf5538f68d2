"""The object-store garbage collector's and the retention job's statements (`sql/queries/gc.sql`),
for minions/store_gc.py and minions/retention.py. The database decides what is garbage; each method
asks it about one batch."""

from __future__ import annotations

from typing import TypedDict

from minions.db.gateway import Gateway
from minions.db.queries import Queries


class StaleInputRow(TypedDict):
    """An input whose ownership record was dropped (or, in a dry run, would be): its object to delete."""

    uri: str
    bytes: int


class KeptResultsRow(TypedDict):
    """One task's results kept in rows whose bytes were dropped (or, in a dry run, would be)."""

    task_id: int
    subtasks: int
    bytes: int


class RetentionBacklogRow(TypedDict):
    tasks: int
    subtasks: int


class RetentionStepRow(TypedDict):
    task_id: int
    subtasks_deleted: int
    attempts_deleted: int
    task_deleted: bool


class GcGateway(Gateway):
    queries = Queries("gc")

    # ---- the store's garbage

    async def stale_input_records(self, *, grace_s: float, dry_run: bool, limit: int) -> list[StaleInputRow]:
        """Drops (unless `dry_run`) up to `limit` input ownership records no task reads, older than
        `grace_s`."""
        rows: list[StaleInputRow] = await self.db.fetch(self.queries.stale_input_records, grace_s, dry_run, limit)
        return rows

    async def unowned_inputs(self, *, uris: list[str]) -> list[str]:
        """Those of `uris` that nobody owns and no task reads."""
        return [row["uri"] for row in await self.db.fetch(self.queries.unowned_inputs, uris)]

    async def garbage_outputs(self, *, keys: list[str]) -> list[str]:
        """Those of the `outputs/` keys that no task, committed result or live lease needs."""
        return [row["key"] for row in await self.db.fetch(self.queries.garbage_outputs, keys)]

    async def garbage_results(self, *, keys: list[str]) -> list[str]:
        """Those of the `results/` keys that no subtask names, or whose task is compacted."""
        return [row["key"] for row in await self.db.fetch(self.queries.garbage_results, keys)]

    async def garbage_parts(self, *, keys: list[str]) -> list[str]:
        """Those of the `parts/` keys that no row records."""
        return [row["key"] for row in await self.db.fetch(self.queries.garbage_parts, keys)]

    async def kept_results(self, *, grace_s: float, dry_run: bool, limit: int) -> list[KeptResultsRow]:
        """Drops (unless `dry_run`) the bytes kept in rows of one batch of tasks compacted over
        `grace_s` ago (a dry run: every task's)."""
        rows: list[KeptResultsRow] = await self.db.fetch(self.queries.kept_results, grace_s, dry_run, limit)
        return rows

    # ---- retention

    async def retention_lock(self) -> bool:
        """Takes the session lock of the one retention run at a time; False when another run holds it."""
        return bool(await self.db.fetchval(self.queries.retention_lock))

    async def retention_unlock(self) -> bool:
        return bool(await self.db.fetchval(self.queries.retention_unlock))

    async def retention_backlog(self, *, age_s: float) -> RetentionBacklogRow:
        """Finished tasks older than `age_s` and their subtasks."""
        row: RetentionBacklogRow = await self.db.fetchrow(self.queries.retention_backlog, age_s)
        return row

    async def retention_step(self, *, age_s: float, batch: int) -> RetentionStepRow | None:
        """Deletes one batch of subtasks of finished tasks older than `age_s` (a task too, once it has
        none left), in one transaction; None when nothing is left."""
        row: RetentionStepRow | None = await self.db.fetchrow(self.queries.retention_step, age_s, batch)
        return row
