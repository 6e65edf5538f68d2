"""The agent: one executor's loop, from registration to deregistration.

register → (wait for the owner policy → long-poll claim → a job per lease: download range → run →
upload → complete) until stopped, with heartbeats on their own task (heartbeat.py). Work is handed
back (release) when the owner needs the machine or the agent stops, and dropped without a word when
a heartbeat says its lease is gone. Each job is in a named state (jobs.py, and the table in
docs/ARCHITECTURE.md); its steps are job_steps.py's.

Pipelined: each lease runs as its own job (input download, then the runner, one job at a time, then
output upload and complete), so the next subtasks are claimed, and their inputs fetched, while one
computes, and its upload and complete go on in the background while the next computes. The leases
held at once are bounded (`max_leases`; by default as deep as the subtasks' measured run time calls
for, claim_depth.py: one beyond the one running for long subtasks, deeper for short ones, at most
what the agent finishes in one heartbeat interval): a Mac that vanishes strands at most that many
until the lease timeout. The next claim is sent when the subtasks queued for the device are down to
what covers a claim's round trip and their inputs' fetch (the depth's low-water mark), or when half
the bound is free, and takes all the room the bound has then: not one lease per freed slot while the
device has work queued, and never so late that it waits.
Small inputs and outputs ride inline in the claim and the complete (API.md); completes go together
through one buffer (completes.py).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from minions.agents.macos import awake
from minions.agents.macos.claim_depth import ClaimDepth, Depth
from minions.agents.macos.client import AuthError, ClientError, Conflict, ExecutorClient, NotFound, Rejected
from minions.agents.macos.completes import Completes
from minions.agents.macos.config import AgentConfig
from minions.agents.macos.hardware import Hardware
from minions.agents.macos.heartbeat import heartbeat_loop
from minions.agents.macos.job_steps import JobSteps
from minions.agents.macos.jobs import AT_WORK, DEVICE_HAS_WORK, QUEUED, Job, JobState, JobTable
from minions.agents.macos.policy import OwnerPolicy
from minions.agents.macos.protocol import Claim, ProtocolError, Registration
from minions.agents.macos.runners.base import ChoosesPrecision, ReportsFingerprints, Runner
from minions.logging import get_logger

log = get_logger(__name__)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        client: ExecutorClient,
        runners: Mapping[str, Runner],
        policy: OwnerPolicy,
        machine: Hardware,
        models: list[str],
        *,
        keep_awake: Callable[[], AbstractAsyncContextManager[None]] = awake.keep_awake,
        policy_poll_s: float = 1.0,
        idle_poll_s: float = 5.0,
        hand_back_timeout_s: float = 5.0,
        max_leases: int | None = None,
    ) -> None:
        self._config = config
        self._client = client
        self._runners = runners
        self._policy = policy
        self._hardware = machine
        self._models = models
        self._keep_awake = keep_awake
        self._policy_poll_s = policy_poll_s
        self._idle_poll_s = idle_poll_s
        self._hand_back_timeout_s = hand_back_timeout_s
        self._max_leases = max_leases  # None: as deep as the measured durations call for
        self._registration: Registration | None = None
        self._jobs = JobTable()
        self._completes = Completes(client, more_expected=lambda: self._jobs.count(AT_WORK) > 0)
        self._depth = ClaimDepth()
        self._depth_logged: Depth | None = None
        self._queue_was_empty = False  # the last claim, sent while the device had work, found none
        self._awake: AbstractAsyncContextManager[None] | None = None  # held while any job is
        self._claiming: asyncio.Task[list[Claim]] | None = None  # the owner's return cancels it
        self._tasks: set[asyncio.Task[None]] = set()  # jobs' supervisors, the owner watch
        self._fatal: asyncio.Future[None] | None = None  # a job's AuthError ends the agent
        self._steps = JobSteps(client, runners, self._completes, self._depth, lambda: self.registration)

    @property
    def registration(self) -> Registration:
        if self._registration is None:
            raise RuntimeError("the agent has not registered yet")
        return self._registration

    @property
    def completed(self) -> int:
        """Subtasks committed by this process, for logs and tests."""
        return self._steps.completed

    def held_leases(self) -> list[str]:
        return self._jobs.tokens()

    def job_states(self) -> dict[str, JobState]:
        """The state of the job of each lease held, by token."""
        return {job.token: job.state for job in self._jobs}

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until cancelled (or a fatal error); then hand back held work and deregister."""
        await self.register()
        registration = self.registration
        precision = self.hardware_report().get("precision", [])
        log.info("agent_ready", name=self._config.name, executor_id=registration.executor_id,
                 api_url=self._config.api_url, kinds=list(self._runners), models=self._models,
                 preferences=[str(p) for p in self._config.preferences], device=self._hardware.device,
                 policy=self._config.policy.describe(), heartbeat_interval_s=registration.heartbeat_interval_s,
                 precision=precision)
        if sys.stdout.isatty():  # its owner, in a terminal; log files hold JSON only
            print(describe(self._config, list(self._runners), self._hardware, self._models, registration,
                           precision), flush=True)
        work = asyncio.create_task(self._work_loop(), name="work")
        heartbeat = asyncio.create_task(heartbeat_loop(self._client, lambda: self.registration, self._jobs),
                                        name="heartbeat")
        self._fatal = asyncio.get_running_loop().create_future()
        try:
            done, _ = await asyncio.wait({work, heartbeat, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a fatal error (a refused token) ends the agent
        finally:
            for task in (work, heartbeat):
                task.cancel()
            await asyncio.wait({work, heartbeat})  # work hands its leases back while it stops
            await self._completes.close(self._hand_back_timeout_s)  # no job is left to hear one
            await self._deregister()

    async def register(self) -> Registration:
        payload = {
            "name": self._config.name,
            "hardware": self.hardware_report(),
            "kinds": list(self._runners),
            "models": self._models,
            "preferences": [p.to_json() for p in self._config.preferences],
            "fingerprints": await self.fingerprints(),
        }
        self._registration = await self._client.register(payload)
        log.info("registered", executor_id=self._registration.executor_id, name=self._config.name)
        return self._registration

    async def fingerprints(self) -> list[dict[str, Any]]:
        """Per model it serves, what it loaded (or will load: the same files): the server gives a task
        only to executors of one fingerprint. A model no runner finds here (downloaded at its first
        subtask) is left out: until it registers again, this executor takes only tasks of that model
        that no fingerprint pinned yet, and pins none."""
        found: dict[str, dict[str, Any]] = {}
        for runner in self._runners.values():
            if isinstance(runner, ReportsFingerprints):
                for report in await runner.fingerprints(self._models):
                    found.setdefault(report["model"], report)
        return list(found.values())

    def hardware_report(self) -> dict[str, Any]:
        """The machine, and the precision each model loaded so far runs in (with its cosine to
        fp32), so that users see what a device really computes."""
        report = self._hardware.to_json()
        chosen = [c for r in self._runners.values() if isinstance(r, ChoosesPrecision) for c in r.precision_reports()]
        if chosen:
            report["precision"] = chosen
        return report

    async def _deregister(self) -> None:
        if self._registration is None:
            return
        try:
            await asyncio.wait_for(self._client.deregister(self._registration.executor_id), self._hand_back_timeout_s)
            log.info("deregistered", executor_id=self._registration.executor_id)
        except (ClientError, TimeoutError) as exc:
            # The watchdog reclaims whatever the server still thinks we hold.
            log.warning("deregister_failed", error=str(exc) or type(exc).__name__)

    # -- claiming ---------------------------------------------------------------------------

    def lease_bound(self) -> int:
        """Most leases held at once: `max_leases`, else the depth the measured run time and round
        trips call for (claim_depth.py)."""
        return self._bound_and_low_water()[0]

    def _bound_and_low_water(self) -> tuple[int, int]:
        """The lease bound and the low-water mark of the device's queue. With `max_leases` set, half
        of it; else the depth's, logged as `claim_depth` whenever the depth or the mark changes (and
        once its figures are first measured)."""
        if self._max_leases is not None:
            bound = max(1, self._max_leases)
            return bound, max(1, bound // 2)
        depth = self.claim_depth()
        last = self._depth_logged
        if (last is None or (depth.leases, depth.low_water) != (last.leases, last.low_water)
                or (last.run_s is None) != (depth.run_s is None)):
            log.info("claim_depth", leases=depth.leases, low_water=depth.low_water, cap=depth.cap,
                     run_s=_rounded(depth.run_s), round_trip_s=_rounded(depth.round_trip_s),
                     claim_s=_rounded(depth.claim_s), fetch_s=_rounded(depth.fetch_s))
            self._depth_logged = depth
        return depth.leases, depth.low_water

    def claim_depth(self) -> Depth:
        """The claim-ahead depth the measurements call for, with the figures it comes from."""
        registration = self.registration
        return self._depth.depth(registration.heartbeat_interval_s, registration.max_claim)

    async def _work_loop(self) -> None:
        try:
            while True:
                await self._policy.wait_until_available(self._idle_poll_s)
                bound, low_water = self._bound_and_low_water()
                room = bound - len(self._jobs)
                # Claim when the device's queue is down to what covers the claim's round trip, or when
                # half the bound is free, taking all the room then: while more is queued, the freed
                # slots add up (one claim of several, not one per finished subtask); later, and the
                # device would wait.
                empty_before, self._queue_was_empty = self._queue_was_empty, False
                # (After an empty answer the next claim waits for a job to move: no spinning. Only
                # while a job is held: one that left during that claim moved already, and with none
                # held nothing would wake the wait; the next claim long-polls instead.)
                if (room <= 0 or (self._jobs.count(QUEUED) > low_water and room < max(1, bound // 2))
                        or (empty_before and self._jobs)):
                    await self._jobs.wait_for_a_change()
                    continue
                # A task of its own: the owner's return cancels a long poll begun before it.
                self._claiming = asyncio.create_task(self._claim(room), name="claim")
                try:
                    claims = await self._claiming
                except asyncio.CancelledError:
                    if (current := asyncio.current_task()) is not None and current.cancelling():
                        raise
                    continue
                finally:
                    self._claiming = None
                for claim in claims:
                    await self._start(claim)
        except asyncio.CancelledError:
            await self._stop_jobs("shutdown")
            raise

    async def _claim(self, room: int) -> list[Claim]:
        """Claim up to `room` leases. While the device has work (a job queued or running) the claim
        asks for an answer at once (`wait=0`): it is claiming ahead, and its time is then a true round
        trip, the figure the depth needs; a long poll's time is the queue's (a claim parked until the
        next task arrives would read as a round trip of seconds). Idle, it long-polls."""
        registration = self.registration
        ahead = self._jobs.count(DEVICE_HAS_WORK) > 0
        sent = time.monotonic()
        try:
            claims = await self._client.claim_batch(registration.executor_id,
                                                    0.0 if ahead else registration.long_poll_s,
                                                    min(room, registration.max_claim))
            if ahead:
                self._depth.claimed(time.monotonic() - sent)
                self._queue_was_empty = not claims
            return claims
        except (NotFound, Conflict) as exc:
            # The server forgot this executor (reset) or marked it offline: register again.
            log.warning("executor_unknown", error=str(exc))
            await asyncio.sleep(1)
            await self.register()
        except (Rejected, ProtocolError) as exc:
            log.error("claim_failed", error=str(exc))
            await asyncio.sleep(5)
        return []

    # -- jobs -------------------------------------------------------------------------------

    async def _start(self, claim: Claim) -> None:
        """A job for the lease, watched until it ends (the machine kept awake while any runs)."""
        if not self._jobs:
            self._awake = self._keep_awake()
            await self._awake.__aenter__()
        job = Job(claim)
        job.task = asyncio.create_task(self._steps.run(job), name=f"subtask {job.label}")
        self._jobs.add(job)
        self._background(self._supervise(job), f"supervise {job.label}")
        if len(self._jobs) == 1:
            self._background(self._watch_owner(), "owner-watch")

    def _background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    async def _supervise(self, job: Job) -> None:
        assert job.task is not None
        await asyncio.wait({job.task})
        try:
            await self._settle(job)
        except AuthError as exc:
            if self._fatal is not None and not self._fatal.done():
                self._fatal.set_exception(exc)
        finally:
            self._jobs.remove(job)
            if not self._jobs and self._awake is not None:
                awake, self._awake = self._awake, None
                await awake.__aexit__(None, None, None)

    async def _stop_jobs(self, reason: str) -> None:
        """Abort every job and wait until each has been handed back (or dropped)."""
        for job in self._jobs:
            job.abort(reason)
        deadline = time.monotonic() + self._hand_back_timeout_s + 1
        while self._jobs and time.monotonic() < deadline:
            await self._jobs.wait_for_a_leave(deadline - time.monotonic())

    async def _settle(self, job: Job) -> None:
        """The job's task has ended: the last word about its lease, when its task could not say it."""
        assert job.task is not None
        if job.ended:
            return
        if job.task.cancelled():
            if job.abort_reason in ("owner", "shutdown"):
                job.move(JobState.RELEASING)
                await self._hand_back(job, job.abort_reason)
                job.move(JobState.RELEASED)
            else:
                log.info("subtask_dropped", subtask=job.label, reason=job.abort_reason)
                job.move(JobState.DROPPED)
            return
        exc = job.task.exception()
        job.move(JobState.CRASHED)
        if isinstance(exc, AuthError):
            raise exc
        # (None: the task returned without an outcome for its lease, a bug as any other.)
        log.error("subtask_crashed", subtask=job.label, error=repr(exc))

    async def _hand_back(self, job: Job, reason: str) -> None:
        try:
            await asyncio.wait_for(self._client.release(job.token), self._hand_back_timeout_s)
            log.info("subtask_released", subtask=job.label, reason=reason)
        except Conflict:
            log.info("subtask_already_gone", subtask=job.label, reason=reason)
        except (ClientError, TimeoutError) as exc:
            log.warning("release_failed", subtask=job.label, error=str(exc) or type(exc).__name__)

    # -- the owner ----------------------------------------------------------------------------

    async def _watch_owner(self) -> None:
        """While any job runs: when the owner needs the machine, every held lease is handed back."""
        while self._jobs:
            await asyncio.sleep(self._policy_poll_s)
            if not self._jobs:
                return
            verdict = await self._policy.check()
            if not verdict.available:
                if self._claiming is not None:
                    self._claiming.cancel()
                for job in self._jobs:
                    log.info("owner_needs_machine", subtask=job.label, reason=verdict.reason)
                    job.abort("owner")
                return


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


def describe(
    config: AgentConfig,
    kinds: list[str],
    machine: Hardware,
    models: list[str],
    registration: Registration,
    precision: Sequence[Mapping[str, Any]] = (),
) -> str:
    """What the agent tells its owner at start: who it is and what it will serve."""
    prefs = ", ".join(str(p) for p in config.preferences) or "none (global FIFO queue)"
    device = f"{machine.device} ({machine.chip}, {machine.memory_gb} GB, {machine.cpu_count} CPUs, {machine.os})"
    precisions = ", ".join(_precision_line(p) for p in precision) or "-"
    every = f"every {registration.heartbeat_interval_s:g} s, long poll {registration.long_poll_s:g} s"
    return "\n".join(
        [
            f"minions agent {config.name!r} registered as {registration.executor_id} at {config.api_url}",
            f"  kinds:       {', '.join(kinds)}",
            f"  models:      {', '.join(models) or 'none'}",
            f"  preferences: {prefs}",
            f"  device:      {device}",
            f"  precision:   {precisions}",
            f"  policy:      {config.policy.describe()}",
            f"  heartbeat:   {every}",
        ]
    )


def _precision_line(report: Mapping[str, Any]) -> str:
    """`MODEL on BACKEND PRECISION (cosine C)`: what the agent chose for a model at its load."""
    cosine = report.get("cosine")
    gate = f" (cosine {cosine:.5f})" if isinstance(cosine, int | float) else ""
    engine = " ".join(str(report[k]) for k in ("backend", "precision", "quantization") if report.get(k))
    return f"{report['model']} on {engine}{gate}"
