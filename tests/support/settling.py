"""Tasks in the state the splitter settles: every subtask closed, the task not ended."""

from __future__ import annotations

import uuid

import asyncpg

from minions.testing.factories import make_task


async def task_left_to_the_splitter(conn: asyncpg.Connection, executor: uuid.UUID) -> int:
    """A one-subtask task whose close could not decide its end: done, not ended, as after closes that
    ran side by side (the close runs inside a batch that defers the decision and never makes it).
    The executor's claim must reach it: nothing else pending comes before it in the queue."""
    task_id = await make_task(conn, subtasks=1)
    lease = await conn.fetchrow("SELECT * FROM minion_claim($1, 60)", executor)
    assert lease["task_id"] == task_id, "another task's subtask came first in the queue"
    async with conn.transaction():
        await conn.execute("SELECT minion_defer_settle()")
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.1)", lease["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "running"
    return task_id
