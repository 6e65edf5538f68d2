"""The base of each service's one door to the database, in the manner of Procrastinate's
`JobManager`: a gateway wraps each named query of `sql/queries/<file>.sql` once, as a method with
keyword arguments and a typed result, so no handler counts `$n` against a SQL signature, sees a
pool or names a query. The method is the only place that knows a query's parameter order.

A gateway runs on whatever it was given: a pool (each call on a pooled connection, in its own
transaction) or a connection (`gateway.on(conn)`: the calls join the caller's transaction, for the
steps that must commit together). Rows come back as asyncpg's `Record`, typed here as a TypedDict
naming the columns a caller reads (a Record reads the same by key), or as `Row` where the row is a
whole table's (a task): mypy then checks the names and types callers use, at no cost per call."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, Self

from minions.db.queries import Queries

# A whole table row (a task, a token) read by key; narrower results have TypedDicts of their own.
Row = Mapping[str, Any]


class Runs(Protocol):
    """What a gateway runs its statements on: an asyncpg pool, connection or pool proxy."""

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]: ...

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any: ...

    async def fetchval(self, query: str, *args: Any, column: int = 0, timeout: float | None = None) -> Any: ...

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str: ...


class Gateway:
    """Subclasses set `queries` (one file of `sql/queries/`) and add one method per query."""

    queries: Queries

    def __init__(self, db: Runs) -> None:
        self.db = db

    def check_queries(self) -> None:
        """Reads its queries files now: an install missing one fails at start, not at its first use."""
        for value in vars(type(self)).values():
            if isinstance(value, Queries):
                value.check()
        self.queries.check()

    def on(self, conn: Runs) -> Self:
        """The same gateway on one connection: its calls join that connection's transaction."""
        return type(self)(conn)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Self]:
        """The same gateway on one pooled connection, in a transaction that commits when the block
        ends (rolls back when it raises). Only a gateway over a pool can open one."""
        acquire = getattr(self.db, "acquire", None)
        if acquire is None:
            raise TypeError("a transaction is opened on a gateway over a pool, not over a connection")
        async with acquire() as conn, conn.transaction():
            yield self.on(conn)


class TaskLocks(Gateway):
    """A gateway whose queries file holds `try_lock_task` and `unlock_task`: a session advisory lock
    on a task, each file's in a key space of its own (a splitter's lock is not a compactor's). Held by
    the connection that took it, so such a gateway runs on one connection, and a process that dies
    releases its locks with it."""

    async def try_lock_task(self, *, task_id: int) -> bool:
        """False when another holder has the task."""
        return bool(await self.db.fetchval(self.queries.try_lock_task, task_id))

    async def unlock_task(self, *, task_id: int) -> bool:
        return bool(await self.db.fetchval(self.queries.unlock_task, task_id))
