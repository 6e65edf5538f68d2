"""The result compactor's statements (`sql/queries/compact.sql`), for minions/result_parts.py."""

from __future__ import annotations

from typing import TypedDict

from minions.db.gateway import TaskLocks
from minions.db.queries import Queries


class LastPartRow(TypedDict):
    part: int
    last_subtask: int


class DoneSubtaskRow(TypedDict):
    """A committed subtask's result, where it lies (minions.committed_results reads it)."""

    subtask_id: int
    output_key: str | None
    result_key: str | None
    result_sha256: bytes | None
    result_bytes: int | None
    result_data: bytes | None
    records: int


class CompactGateway(TaskLocks):
    """On one connection: a task's compaction lock is a session lock, taken and released there."""

    queries = Queries("compact")

    async def tasks_to_compact(self, *, limit: int) -> list[int]:
        """Completed tasks not compacted yet."""
        return [row["task_id"] for row in await self.db.fetch(self.queries.tasks_to_compact, limit)]

    async def last_part(self, *, task_id: int) -> LastPartRow | None:
        """The task's last recorded part; None before the first."""
        row: LastPartRow | None = await self.db.fetchrow(self.queries.last_part, task_id)
        return row

    async def done_subtasks(self, *, task_id: int, after: int, limit: int) -> list[DoneSubtaskRow]:
        """One page of the task's committed subtasks in input order, after subtask `after`."""
        rows: list[DoneSubtaskRow] = await self.db.fetch(self.queries.done_subtasks, task_id, after, limit)
        return rows

    async def record_part(self, *, task_id: int, part: int, first_subtask: int, last_subtask: int, key: str,
                          sha256: bytes, size: int, records: int) -> bool:
        """Records a written part; False when it is not the next part of a completed task any more."""
        return bool(await self.db.fetchval(self.queries.record_part, task_id, part, first_subtask, last_subtask, key,
                                           sha256, size, records))

    async def finish_compaction(self, *, task_id: int) -> bool:
        """Whether every subtask is covered by a part: the task is then compacted."""
        return bool(await self.db.fetchval(self.queries.finish_compaction, task_id))
