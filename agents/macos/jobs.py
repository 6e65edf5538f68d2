"""The agent's jobs: one per lease it holds, each in a named state, and the table that holds them.

A job moves through its states along TRANSITIONS only (docs/ARCHITECTURE.md draws the table); a
move the table does not allow is a bug in the agent and raises `IllegalTransition` rather than
leave a lease in a phase no code expects. A job stays in the table, whatever its state, until its
last word to the server (complete, fail, release) is answered: its token is sent with every
heartbeat until then, and it counts against the lease bound.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from minions.agents.macos.protocol import Claim
from minions.logging import get_logger

log = get_logger(__name__)


class JobState(enum.StrEnum):
    CLAIMED = "claimed"  # the lease is held: its input being fetched, or waiting for the device
    RUNNING = "running"  # the runner has it (one job at a time holds the device)
    UPLOADING = "uploading"  # its output, too large to ride in the complete, being PUT to the store
    COMMITTING = "committing"  # its complete queued in the commit buffer, in flight, or being answered
    FAILING = "failing"  # its fail being sent (the runner, the input or the output check failed)
    RELEASING = "releasing"  # aborted by the owner's return or a shutdown: being handed back
    DONE = "done"  # committed
    FAILED = "failed"  # the server heard the failure (it retries the subtask elsewhere, or fails it)
    RELEASED = "released"  # handed back (or the hand-back failed: the watchdog reclaims it)
    DROPPED = "dropped"  # the lease is gone (lost, cancelled, a late complete refused): nothing more to say
    CRASHED = "crashed"  # an error no step expects (a refused token ends the agent); left to the lease timeout


ENDED = frozenset({JobState.DONE, JobState.FAILED, JobState.RELEASED, JobState.DROPPED, JobState.CRASHED})
# Still becoming a complete: the commit buffer lingers for these.
AT_WORK = frozenset({JobState.CLAIMED, JobState.RUNNING, JobState.UPLOADING})
# Held and not yet at the device: its input being fetched, or waiting for the runner.
QUEUED = frozenset({JobState.CLAIMED})
# Keeping the device busy, or about to: a claim sent while one is held is a claim ahead.
DEVICE_HAS_WORK = frozenset({*QUEUED, JobState.RUNNING})
# A heartbeat that says the lease is gone aborts the job in these states. Not while committing: the
# server answers "lost" for a lease it has just committed (it is no longer leased), and the
# complete's own answer says what happened.
HEARTBEAT_ABORTS = frozenset({*AT_WORK, JobState.FAILING})

_ABORTED = {JobState.RELEASING, JobState.DROPPED, JobState.CRASHED}
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.CLAIMED: frozenset({JobState.RUNNING, JobState.FAILING, *_ABORTED}),
    JobState.RUNNING: frozenset({JobState.UPLOADING, JobState.COMMITTING, JobState.FAILING, *_ABORTED}),
    JobState.UPLOADING: frozenset({JobState.COMMITTING, JobState.FAILING, *_ABORTED}),
    # 409: the lease was reclaimed meanwhile (dropped); 422: the server found the output wrong (failing).
    JobState.COMMITTING: frozenset({JobState.DONE, JobState.FAILING, *_ABORTED}),
    # A fail refused with 409 (the lease was gone already) ends it as dropped.
    JobState.FAILING: frozenset({JobState.FAILED, *_ABORTED}),
    JobState.RELEASING: frozenset({JobState.RELEASED}),
    **{ended: frozenset() for ended in ENDED},
}


class IllegalTransition(RuntimeError):
    """A job was moved where TRANSITIONS does not allow: a bug in the agent."""


@dataclass(eq=False)
class Job:
    """One lease and the task that works on it."""

    claim: Claim
    task: asyncio.Task[None] | None = None
    state: JobState = JobState.CLAIMED
    abort_reason: str | None = None  # owner | shutdown | lost | cancelled
    history: list[JobState] = field(default_factory=lambda: [JobState.CLAIMED])
    moved: Callable[[], None] | None = None  # told after every move (the table's change event)

    @property
    def token(self) -> str:
        return self.claim.token

    @property
    def label(self) -> str:
        return self.claim.subtask.label

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def move(self, to: JobState) -> None:
        """Into state `to`, if TRANSITIONS allows it from the current one; else IllegalTransition."""
        if to not in TRANSITIONS[self.state]:
            log.error("illegal_job_transition", subtask=self.label, state=self.state.value, to=to.value,
                      history=[s.value for s in self.history])
            raise IllegalTransition(f"job {self.label}: {self.state.value} -> {to.value} is not a transition")
        self.state = to
        self.history.append(to)
        if self.moved is not None:
            self.moved()

    def abort(self, reason: str) -> None:
        """Stop its task (the first reason given is the one kept); its settling hands the lease back
        (owner, shutdown) or drops it (lost, cancelled)."""
        if self.abort_reason is None and self.task is not None and not self.task.done():
            self.abort_reason = reason
            self.task.cancel()


class JobTable:
    """The jobs of the leases held, by token, and events for the work loop: a job left, or any job
    moved (one reaching the device shortens the queue the next claim must be sent before it empties)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._left = asyncio.Event()
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(list(self._jobs.values()))

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def get(self, token: str) -> Job | None:
        return self._jobs.get(token)

    def tokens(self) -> list[str]:
        return list(self._jobs)

    def count(self, states: frozenset[JobState]) -> int:
        return sum(1 for job in self._jobs.values() if job.state in states)

    def add(self, job: Job) -> None:
        if job.token in self._jobs:
            raise IllegalTransition(f"lease {job.token} is held already")
        self._jobs[job.token] = job
        job.moved = self._changed.set

    def remove(self, job: Job) -> None:
        """The job's last word was answered (it has ended): its lease is no longer held. One that
        has not ended is a bug, logged as such, and still removed: a job that never leaves would
        hold its slot of the lease bound, and its token in every heartbeat, forever."""
        if not job.ended:
            log.error("job_left_unended", subtask=job.label, state=job.state.value,
                      history=[s.value for s in job.history])
        self._jobs.pop(job.token, None)
        job.moved = None
        self._left.set()
        self._changed.set()

    async def wait_for_a_leave(self, timeout_s: float | None = None) -> None:
        """Until a job leaves the table (from now on), or `timeout_s` passes."""
        self._left.clear()
        if timeout_s is None:
            await self._left.wait()
            return
        try:
            await asyncio.wait_for(self._left.wait(), max(0.0, timeout_s))
        except TimeoutError:
            return

    async def wait_for_a_change(self) -> None:
        """Until a job leaves the table or moves to another state (from now on)."""
        self._changed.clear()
        await self._changed.wait()
