"""A split worker: on every wake-up and every sweep interval, find unsplit tasks, take each one's
advisory lock and split it. Several workers (in this process or in other splitters) share the work
through those locks; a worker that loses its connection backs off, reconnects and sweeps again.
Workers also end the tasks whose last closes could not tell which was last: those a notification
named at once, every open one on start and every sweep interval (sql/schema/04_tasks.sql)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field

import asyncpg

from minions.backoff import Backoff
from minions.db.connect import CONNECTION_ERRORS, connect
from minions.logging import get_logger
from minions.services.splitter.gateway import SplitterGateway
from minions.services.splitter.listener import Wakeup
from minions.services.splitter.split import SplitResult, split_task
from minions.store.base import ObjectStore

SWEEP_LIMIT = 100  # tasks looked at per sweep query; a full page triggers another sweep
# An input that stays unreadable (bucket gone, no permission) fails its task after this many tries.
MAX_STORE_ATTEMPTS = 8
MAX_RETRY_DELAY_S = 300.0


def lost_connection(conn: asyncpg.Connection, exc: BaseException) -> bool:
    """Whether `exc` means the database connection is gone. asyncpg reports a connection the
    server dropped in several ways (ConnectionDoesNotExistError, InterfaceError, even
    InternalClientError when the drop races a new statement); the connection knows it is closed."""
    return isinstance(exc, CONNECTION_ERRORS) or conn.is_closed()


@dataclass
class RetryBook:
    """Tasks whose input could not be read, shared by the workers of one process: when each may be
    tried again, and how many tries failed."""

    sweep_interval_s: float
    not_before: dict[int, float] = field(default_factory=dict)
    failures: dict[int, int] = field(default_factory=dict)

    def waiting(self, task_id: int) -> bool:
        return self.not_before.get(task_id, 0.0) > time.monotonic()

    def failed(self, task_id: int) -> int:
        count = self.failures.get(task_id, 0) + 1
        self.failures[task_id] = count
        delay = min(self.sweep_interval_s * 2 ** (count - 1), MAX_RETRY_DELAY_S)
        self.not_before[task_id] = time.monotonic() + delay
        return count

    def forget(self, task_id: int) -> None:
        self.not_before.pop(task_id, None)
        self.failures.pop(task_id, None)


class Worker:
    def __init__(self, name: str, database_url: str, store: ObjectStore, wakeup: Wakeup,
                 retries: RetryBook, *, sweep_interval_s: float) -> None:
        self.name = name
        self.database_url = database_url
        self.store = store
        self.wakeup = wakeup
        self.wake = wakeup.subscribe()
        self.retries = retries
        self.sweep_interval_s = sweep_interval_s
        self.log = get_logger("splitter.worker").bind(worker=name)

    async def run(self) -> None:
        """Until cancelled. A split cut short by a lost connection (or by cancellation) keeps its
        inserted batches and the lock goes with the session: the next sweep resumes it."""
        backoff = Backoff()
        while True:
            try:
                conn = await connect(self.database_url)
            except Exception as exc:  # unreachable, starting up, wrong password: all may pass
                self.log.warning("database_unreachable", error=repr(exc))
                await backoff.sleep()
                continue
            try:
                await self._serve(conn, backoff)
            except Exception as exc:
                self._log_failure(conn, exc)
            finally:
                # terminate, not close: the connection may be in the middle of a statement. Any
                # advisory lock it held goes with it.
                conn.terminate()
            await backoff.sleep()

    def _log_failure(self, conn: asyncpg.Connection, exc: Exception) -> None:
        if lost_connection(conn, exc):
            self.log.warning("database_connection_lost", error=repr(exc))
        elif isinstance(exc, asyncpg.PostgresError):
            # E.g. the schema is not migrated yet, or an operator cancelled a statement.
            self.log.error("database_error", error=repr(exc))
        else:
            # A bug must not stop the splitter; the retry book keeps it from spinning on a task.
            self.log.exception("unexpected_error")

    async def _serve(self, conn: asyncpg.Connection, backoff: Backoff) -> None:
        # Every open task is looked at on (re)connecting, when asked and every sweep interval; between
        # those, only the tasks notifications named: a wake-up costs O(named), not O(tasks queued).
        db = SplitterGateway(conn)
        swept_at = -math.inf  # never: the first look is a sweep
        sweeps_done = self.wakeup.sweeps_asked
        while True:
            self.wake.clear()
            asked = self.wakeup.sweeps_asked
            named = self.wakeup.take_named()
            if asked != sweeps_done or time.monotonic() - swept_at >= self.sweep_interval_s:
                await self._sweep(db)
                swept_at, sweeps_done = time.monotonic(), asked
            else:
                await self._split_sweep(db)
            # After a sweep too: it looks at one page of tasks, and a named one may lie past it.
            await self._settle_named(db, named)
            backoff.reset()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(),
                                       timeout=max(0.0, swept_at + self.sweep_interval_s - time.monotonic()))

    async def _sweep(self, db: SplitterGateway) -> None:
        await self._split_sweep(db)
        await self._settle_sweep(db)

    async def _settle_sweep(self, db: SplitterGateway) -> None:
        """Ends the tasks whose last closes ran side by side and could not tell which was last
        (sql/schema/04_tasks.sql): each in its own statement, waiting for those closes."""
        for task_id in await db.settle_candidates(limit=SWEEP_LIMIT):
            await self._settle(db, task_id)

    async def _settle_named(self, db: SplitterGateway, task_ids: list[int]) -> None:
        """The same for the tasks notifications named, those of them that may have ended."""
        if task_ids:
            for task_id in await db.settle_candidates_among(task_ids=task_ids):
                await self._settle(db, task_id)

    async def _settle(self, db: SplitterGateway, task_id: int) -> None:
        if await db.settle_waiting(task_id=task_id):
            self.log.info("task_settled", task_id=task_id)

    async def _split_sweep(self, db: SplitterGateway) -> None:
        while True:
            task_ids = await db.unsplit_tasks(limit=SWEEP_LIMIT)
            progressed = False
            for task_id in task_ids:
                if self.retries.waiting(task_id):
                    continue
                if not await db.try_lock_task(task_id=task_id):
                    continue  # another splitter (or worker) has it
                result = await self._split_locked(db, task_id)
                await db.unlock_task(task_id=task_id)
                progressed = progressed or result.outcome != "skipped"
            if not progressed or len(task_ids) < SWEEP_LIMIT:
                return

    async def _split_locked(self, db: SplitterGateway, task_id: int) -> SplitResult:
        try:
            # On the connection that holds the task's lock.
            result = await split_task(db.conn, self.store, task_id)
        except Exception as exc:
            # A lost connection is retried at once, after the reconnect (the split resumes); any
            # other failure waits its turn in the retry book, so a task that trips a bug cannot
            # keep the worker spinning.
            if not lost_connection(db.conn, exc):
                self.retries.failed(task_id)
            raise
        if result.outcome != "retry":
            self.retries.forget(task_id)
            return result
        tries = self.retries.failed(task_id)
        if tries >= MAX_STORE_ATTEMPTS:
            error = f"input unreadable after {tries} attempts: {result.error}"
            self.log.error("input_given_up", task_id=task_id, error=error)
            await db.fail_split(task_id=task_id, error=error)
            self.retries.forget(task_id)
        return result
