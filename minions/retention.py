"""The retention job: deletes finished tasks older than MINIONS_RETENTION_DAYS with
their subtasks and attempt history, so `subtasks` and `subtask_attempts` stop growing without bound.

The database decides and deletes (minion_retention_step, sql/schema/12_retention.sql), one batch of
subtasks per call and so per transaction: no lock is held longer than one batch. Only one run at a
time across the cluster (several watchdogs, an operator's `minions gc --retention`): the run holds a
session advisory lock, and a second contender skips instead of waiting. Their objects are then the
store collector's garbage (minions/store_gc.py), as after `minions delete`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from minions.db.gateways.gc import GcGateway
from minions.logging import get_logger

log = get_logger(__name__)
DAY_S = 86_400.0
# A few thousand rows per transaction keeps each step's locks and WAL burst short (docs/SCALE.md).
BATCH = 2_000
PROGRESS_EVERY_S = 5.0


@dataclass
class RetentionReport:
    age_days: float
    ran: bool = True  # False: another run held the lock
    tasks: int = 0
    subtasks: int = 0
    attempts: int = 0
    steps: int = 0
    backlog_tasks: int = 0  # finished tasks older than the age when the run began
    backlog_subtasks: int = 0

    def summary(self) -> str:
        if not self.ran:
            return "another retention run holds the lock; nothing done"
        return (f"deleted {self.tasks:,} of {self.backlog_tasks:,} tasks finished over {self.age_days:g} days ago: "
                f"{self.subtasks:,} of {self.backlog_subtasks:,} subtasks, {self.attempts:,} attempts "
                f"({self.steps:,} batches)")


Progress = Callable[[RetentionReport], None]


async def run_retention(conn: asyncpg.Connection, age_days: float, *, batch: int = BATCH,
                        progress: Progress | None = None, should_stop: Callable[[], bool] = lambda: False
                        ) -> RetentionReport:
    """Run the job to the end (or until `should_stop`) on `conn`, which must not be in a transaction."""
    report = RetentionReport(age_days)
    age_s = age_days * DAY_S
    db = GcGateway(conn)  # the run's session lock is this connection's: every step runs on it
    if not await db.retention_lock():
        report.ran = False
        log.info("retention_skipped", reason="another run holds the lock")
        return report
    try:
        backlog = await db.retention_backlog(age_s=age_s)
        report.backlog_tasks, report.backlog_subtasks = int(backlog["tasks"]), int(backlog["subtasks"])
        log.info("retention_started", age_days=age_days, tasks=report.backlog_tasks,
                 subtasks=report.backlog_subtasks)
        last_report = time.monotonic()
        while not should_stop():
            row = await db.retention_step(age_s=age_s, batch=batch)
            if row is None:
                break
            report.steps += 1
            report.subtasks += row["subtasks_deleted"]
            report.attempts += row["attempts_deleted"]
            report.tasks += int(row["task_deleted"])
            if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                last_report = time.monotonic()
                log.info("retention_progress", tasks=report.tasks, subtasks=report.subtasks,
                         attempts=report.attempts, of_tasks=report.backlog_tasks,
                         of_subtasks=report.backlog_subtasks)
                if progress:
                    progress(report)
    finally:
        await db.retention_unlock()
    log.info("retention_done", tasks=report.tasks, subtasks=report.subtasks, attempts=report.attempts,
             steps=report.steps)
    if progress:
        progress(report)
    return report
