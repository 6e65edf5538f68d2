"""The splitter's one door to the database: every statement of `sql/queries/splitter.sql`, wrapped
once with keyword arguments and a typed result (the base is minions/db/gateway.py). The split steps
themselves are SQL functions (sql/schema/04_tasks.sql); a method is a translation, never a decision."""

from __future__ import annotations

from typing import TypedDict

import asyncpg

from minions.db.gateway import TaskLocks
from minions.db.queries import Queries


class SplitStart(TypedDict):
    """Where a split (re)starts: the input's offset and records already cut into subtasks, and the
    next subtask's id."""

    split_offset: int
    split_records: int
    next_subtask_id: int


class SplitTask(TypedDict):
    id: int
    kind: str
    subtask_size: int
    input_uri: str


class SplitStatus(TypedDict):
    status: str
    split_done: bool


class SplitterGateway(TaskLocks):
    """On one connection, never a pool: a task's split lock is a session lock, so the lock, the split
    and the unlock must all run on the connection that holds it (and a splitter that dies releases
    it with that connection)."""

    queries = Queries("splitter")

    def __init__(self, conn: asyncpg.Connection) -> None:
        super().__init__(conn)
        self.conn = conn

    async def store_signing_key(self) -> str | None:
        """None before the schema is migrated (the key is its mark)."""
        key: str | None = await self.db.fetchval(self.queries.store_signing_key)
        return key

    # ---- finding and locking the work

    async def unsplit_tasks(self, *, limit: int) -> list[int]:
        """Tasks still waiting for (the rest of) their split, most urgent first."""
        return [row["id"] for row in await self.db.fetch(self.queries.unsplit_tasks, limit)]

    # ---- one split

    async def begin_split(self, *, task_id: int) -> SplitStart | None:
        """Begins (or resumes) the task's split; None when it is no longer splittable (split, cancelled,
        failed)."""
        row: SplitStart | None = await self.db.fetchrow(self.queries.begin_split, task_id)
        return None if row is None or row["split_offset"] is None else row

    async def task_for_split(self, *, task_id: int) -> SplitTask | None:
        row: SplitTask | None = await self.db.fetchrow(self.queries.task_for_split, task_id)
        return row

    async def task_status(self, *, task_id: int) -> SplitStatus | None:
        row: SplitStatus | None = await self.db.fetchrow(self.queries.task_status, task_id)
        return row

    async def add_subtasks(self, *, task_id: int, byte_starts: list[int], byte_ends: list[int],
                           first_records: list[int], records: list[int], first_subtask_id: int,
                           split_offset: int, split_records: int) -> bool:
        """Inserts one batch of subtasks (parallel lists, ids from `first_subtask_id` on) and moves the
        split's mark to `split_offset` / `split_records`; False (nothing inserted) when the task was
        cancelled or failed meanwhile."""
        return bool(await self.db.fetchval(self.queries.add_subtasks, task_id, byte_starts, byte_ends, first_records,
                                           records, first_subtask_id, split_offset, split_records))

    async def finish_split(self, *, task_id: int) -> None:
        await self.db.execute(self.queries.finish_split, task_id)

    async def fail_split(self, *, task_id: int, error: str) -> None:
        """Fails the task with `error`; its subtasks are deleted."""
        await self.db.execute(self.queries.fail_split, task_id, error)

    # ---- ending tasks whose last closes could not tell which was last (sql/schema/04_tasks.sql)

    async def settle_candidates(self, *, limit: int) -> list[int]:
        """Every open task that may have ended with closes that could not decide it."""
        return [row["id"] for row in await self.db.fetch(self.queries.settle_candidates, limit)]

    async def settle_candidates_among(self, *, task_ids: list[int]) -> list[int]:
        """The same, among `task_ids`."""
        return [row["id"] for row in await self.db.fetch(self.queries.settle_candidates_among, task_ids)]

    async def settle_waiting(self, *, task_id: int) -> bool:
        """Waits for the closes in flight, then settles the task; whether it ended."""
        return bool(await self.db.fetchval(self.queries.settle_waiting, task_id))
