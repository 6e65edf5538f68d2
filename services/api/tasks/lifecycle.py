"""A task after submission, as its owner steers it: cancel, retry (its failed subtasks run again),
verify (its results run again by others, as a task of their own) and delete. Each is one SQL
function (sql/schema/04_tasks.sql, 11_checks.sql); here their verdicts become the caller's answers."""

from __future__ import annotations

from minions.kinds import FINISHED_TASK_STATUSES
from minions.logging import get_logger
from minions.services.api.context import Context
from minions.services.api.gateway import TaskRow
from minions.services.api.http.errors import conflict, not_found

log = get_logger(__name__)


def _ref(task: TaskRow) -> str:
    return f"{task['team']}/{task['project']}/{task['name']}"


async def _current(ctx: Context, task: TaskRow) -> TaskRow:
    """The task as it is now (after a change), or as it was when it went meanwhile."""
    return await ctx.gateway.task_by_id(task_id=task["id"]) or task


async def cancel(ctx: Context, task: TaskRow) -> TaskRow:
    """The task cancelled (or already cancelled); 409 when it had ended otherwise."""
    if not await ctx.gateway.cancel_task(task_id=task["id"]):
        if task["status"] != "cancelled":
            raise conflict("task_finished", f"task is already {task['status']}; only a running task can be "
                                            "cancelled")
    log.info("task_cancelled", task_id=task["id"])
    return await _current(ctx, task)


async def retry(ctx: Context, task: TaskRow) -> TaskRow:
    """A failed task's failed subtasks run again, each with a fresh budget of attempts; its committed
    results stay (minion_retry_task)."""
    verdict, subtasks = await ctx.gateway.retry_task(task_id=task["id"])
    if verdict == "missing":
        raise not_found(f"task {_ref(task)}")
    if verdict == "not_failed":
        status = (await _current(ctx, task))["status"]
        raise conflict("task_not_failed", f"task {_ref(task)} is {status}; only a failed task can be retried"
                       + (" (it has not ended: wait for it)" if status not in FINISHED_TASK_STATUSES else ""))
    if verdict == "nothing_to_retry":
        raise conflict("nothing_to_retry", f"task {_ref(task)} failed with no failed subtask to run again "
                                           f"({task['error'] or 'its input could not be split'}); fix its input "
                                           "and submit it again (`minions submit --replace`)")
    log.info("task_retried", task_id=task["id"], subtasks=subtasks)
    return await _current(ctx, task)


async def verify(ctx: Context, task: TaskRow, *, name: str, every: bool,
                 token_id: int | None) -> tuple[TaskRow | None, int]:
    """A finished task's results run again by others as task `name` (minion_verify_task): those that
    came from an executor quarantined since, or `every` one. The new task (None: nothing to verify)
    and how many subtasks it runs."""
    if task["status"] not in FINISHED_TASK_STATUSES:
        raise conflict("task_not_finished", f"task is {task['status']}: results of an open task are checked as "
                                            "it runs (those of a quarantined executor run again by themselves)")
    made = await ctx.gateway.verify_task(task_id=task["id"], name=name, every=every, token_id=token_id)
    if made["subtasks"] == -1:
        raise conflict("task_exists", f"a task named {task['team']}/{task['project']}/{name} exists already")
    if made["task_id"] is None:
        return None, made["subtasks"]
    log.info("task_verification_submitted", task_id=task["id"], verify_task_id=made["task_id"],
             subtasks=made["subtasks"])
    return await ctx.gateway.task_by_id(task_id=made["task_id"]), made["subtasks"]


async def delete(ctx: Context, task: TaskRow) -> None:
    """A finished task goes, with its subtasks; its input and results are garbage from then on (the
    collector deletes them after the grace period, and the team's input quota gets the room back)."""
    verdict = await ctx.gateway.delete_task(task_id=task["id"])
    if verdict == "not_finished":
        raise conflict("not_finished", f"task is {task['status']}; cancel it first")
    if verdict == "missing":
        raise not_found(f"task {_ref(task)}")
    log.info("task_deleted", task_id=task["id"])
