"""The agent's heartbeats: every `heartbeat_interval_s`, the tokens of every lease it holds; the
answer renews them, brings fresh input URLs, and names the leases that are gone (lost, cancelled),
whose jobs are then aborted and dropped without a word."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from minions.agents.macos.client import Conflict, ExecutorClient, Rejected
from minions.agents.macos.jobs import HEARTBEAT_ABORTS, JobTable
from minions.agents.macos.protocol import Registration
from minions.logging import get_logger

log = get_logger(__name__)


async def heartbeat_loop(client: ExecutorClient, registration: Callable[[], Registration], jobs: JobTable) -> None:
    """Forever; `registration` is read at each beat (the agent registers again when the server
    forgets it)."""
    while True:
        await asyncio.sleep(registration().heartbeat_interval_s)
        await beat(client, registration().executor_id, jobs)


async def beat(client: ExecutorClient, executor_id: str, jobs: JobTable) -> None:
    tokens = jobs.tokens()
    try:
        states, input_urls = await client.heartbeat(executor_id, tokens)
    except Conflict as exc:  # the executor is offline to the server: none of its leases is held
        states, input_urls = dict.fromkeys(tokens, "lost"), {}
        log.warning("heartbeat_refused", error=str(exc))
    except Rejected as exc:
        log.warning("heartbeat_refused", error=str(exc))
        return
    for token, url in input_urls.items():
        # A renewed lease's fresh input URL: its download (or a retry of it) reads it from here.
        if (renewed := jobs.get(token)) is not None:
            renewed.claim.subtask.input.url = url
    for token, state in states.items():
        job = jobs.get(token)
        # A job committing is left to its complete's answer (the server answers "lost" for a lease
        # it has just committed); one that has ended or is being handed back has nothing to stop.
        if job is not None and state != "ok" and job.state in HEARTBEAT_ABORTS:
            log.info("lease_gone", subtask=job.label, state=state, job_state=job.state.value)
            job.abort(state)
