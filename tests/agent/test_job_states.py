"""The agent's job states (agents/macos/jobs.py): the transitions the table allows, a move it does
not allow refused as the bug it is, and the job table the work loop and the heartbeats read."""

from __future__ import annotations

import asyncio

import pytest

from minions.agents.macos.jobs import (
    AT_WORK,
    ENDED,
    HEARTBEAT_ABORTS,
    TRANSITIONS,
    IllegalTransition,
    Job,
    JobState,
    JobTable,
)
from minions.agents.macos.protocol import Claim
from minions.protocol import LeaseTerms
from tests.agent.factories import subtask

S = JobState


def claim(token: str = "L1") -> Claim:
    return Claim(lease=LeaseTerms(token=token, expires_at="2026-11-29T10:00:00+00:00"), subtask=subtask("sleep"))


def walk(*states: JobState) -> Job:
    job = Job(claim())
    for state in states:
        job.move(state)
    return job


@pytest.mark.parametrize("path", [
    (S.RUNNING, S.COMMITTING, S.DONE),  # a small output, inline in the complete
    (S.RUNNING, S.UPLOADING, S.COMMITTING, S.DONE),  # a large one, PUT first
    (S.FAILING, S.FAILED),  # the input could not be read, or no runner serves the kind
    (S.RUNNING, S.FAILING, S.FAILED),  # the runner failed
    (S.RUNNING, S.UPLOADING, S.FAILING, S.FAILED),  # the store refused the output
    (S.RUNNING, S.COMMITTING, S.FAILING, S.FAILED),  # 422: the server found the output wrong
    (S.RUNNING, S.COMMITTING, S.DROPPED),  # 409: a late complete, the lease reclaimed meanwhile
    (S.RUNNING, S.FAILING, S.DROPPED),  # the fail refused: the lease was gone already
    (S.RUNNING, S.DROPPED),  # a heartbeat said lost or cancelled
    (S.RUNNING, S.RELEASING, S.RELEASED),  # the owner came back, or the agent stops
    (S.RUNNING, S.COMMITTING, S.RELEASING, S.RELEASED),  # stopped while its complete waited
    (S.RUNNING, S.CRASHED),  # an error no step expects
])
def test_the_paths_the_agent_takes_are_transitions(path: tuple[JobState, ...]) -> None:
    job = walk(*path)
    assert job.state is path[-1] and job.ended
    assert job.history == [S.CLAIMED, *path]


@pytest.mark.parametrize(("path", "illegal"), [
    ((), S.DONE),  # committed without running
    ((S.RUNNING, S.COMMITTING, S.DONE), S.RUNNING),  # an ended job goes nowhere
    ((S.RUNNING, S.COMMITTING, S.DONE), S.RELEASING),  # nor is a committed lease handed back
    ((S.RUNNING, S.RELEASING), S.DROPPED),  # being handed back ends released, whatever the answer
    ((S.RUNNING,), S.CLAIMED),  # no way back
    ((S.RUNNING, S.FAILING), S.COMMITTING),  # a failed job does not commit after all
    ((S.RUNNING, S.UPLOADING), S.RUNNING),
])
def test_a_move_the_table_does_not_allow_is_refused(path: tuple[JobState, ...], illegal: JobState) -> None:
    job = walk(*path)
    before = job.state
    with pytest.raises(IllegalTransition, match=f"{before.value} -> {illegal.value}"):
        job.move(illegal)
    assert job.state is before and job.history == [S.CLAIMED, *path]


def test_the_table_covers_every_state_and_every_job_can_end() -> None:
    assert set(TRANSITIONS) == set(JobState)
    assert all(TRANSITIONS[state] == frozenset() for state in ENDED)
    for start in set(JobState) - ENDED:
        reached, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()] - reached:
                reached.add(nxt)
                frontier.append(nxt)
        assert reached & ENDED, start
    # Every state still at work can be stopped by the owner (handed back) or by the server (dropped).
    for state in set(JobState) - ENDED - {S.RELEASING}:
        assert {S.RELEASING, S.DROPPED} <= TRANSITIONS[state], state


def test_a_committing_job_is_not_one_a_heartbeat_stops() -> None:
    # The server answers "lost" for a lease it has just committed: the complete's answer decides.
    assert S.COMMITTING not in HEARTBEAT_ABORTS
    assert AT_WORK <= HEARTBEAT_ABORTS and S.FAILING in HEARTBEAT_ABORTS
    assert not HEARTBEAT_ABORTS & (ENDED | {S.RELEASING})


async def test_abort_cancels_the_task_once_and_keeps_the_first_reason() -> None:
    job = Job(claim())
    job.task = asyncio.create_task(asyncio.sleep(60))
    job.abort("lost")
    job.abort("owner")
    assert job.abort_reason == "lost"
    with pytest.raises(asyncio.CancelledError):
        await job.task
    done = Job(claim("L2"))
    done.task = asyncio.create_task(asyncio.sleep(0))
    await done.task
    done.abort("owner")  # nothing left to stop
    assert done.abort_reason is None


async def test_the_table_counts_states_and_wakes_the_work_loop_when_a_job_leaves() -> None:
    table = JobTable()
    first, second = Job(claim("L1")), Job(claim("L2"))
    table.add(first)
    table.add(second)
    with pytest.raises(IllegalTransition):
        table.add(Job(claim("L1")))
    second.move(S.RUNNING)
    assert table.tokens() == ["L1", "L2"] and len(table) == 2
    assert table.count(AT_WORK) == 2 and table.count(frozenset({S.RUNNING})) == 1
    waiting = asyncio.create_task(table.wait_for_a_leave())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    second.move(S.COMMITTING)
    second.move(S.DONE)
    table.remove(second)
    await asyncio.wait_for(waiting, 1)
    assert table.tokens() == ["L1"] and table.get("L2") is None and table.get("L1") is first
    await table.wait_for_a_leave(0.01)  # nothing leaves: the timeout ends the wait


async def test_the_table_wakes_the_work_loop_when_a_job_moves() -> None:
    """A job reaching the device shortens the queue the next claim must be sent before it empties:
    the loop hears moves as well as leaves, and stops hearing a job once it left."""
    table = JobTable()
    job = Job(claim("L1"))
    table.add(job)
    waiting = asyncio.create_task(table.wait_for_a_change())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    job.move(S.RUNNING)
    await asyncio.wait_for(waiting, 1)
    waiting = asyncio.create_task(table.wait_for_a_change())
    await asyncio.sleep(0.01)
    job.move(S.COMMITTING)
    job.move(S.DONE)
    table.remove(job)
    await asyncio.wait_for(waiting, 1)
    assert job.moved is None


async def test_a_job_that_leaves_unended_is_still_removed() -> None:
    table = JobTable()
    job = Job(claim())
    table.add(job)
    table.remove(job)  # a bug, logged: but a job that never left would hold its slot forever
    assert not table
