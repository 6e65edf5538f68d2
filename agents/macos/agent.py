"""The agent's main loop.

register → (wait for the owner policy → long-poll claim → download range → run → upload → complete)
forever, with heartbeats on their own task. Work is handed back (release) when the owner needs the
machine or the agent stops, and dropped without a word when a heartbeat says its lease is gone.

Pipelined: each lease runs as its own job (input download, then the runner, one job at a
time, then output upload and complete), so the next subtasks are claimed, and their inputs fetched,
while one computes, and its upload and complete go on in the background while the next computes.
The leases held at once are bounded (`max_leases`; by default as deep as the subtasks' measured
run time calls for, claim_depth.py: one beyond the one running for long subtasks, deeper for short
ones, at most what the agent finishes in one heartbeat interval): a Mac that vanishes strands at most
that many until the lease timeout; while half the bound or more is held, the next claim waits until
half is free, so fast subtasks are claimed many at a time. Small inputs and outputs ride inline in
the claim and the complete (API.md). One complete is in flight at a time: those that come meanwhile wait and then go
together in one batched `POST /api/v1/leases/complete`, each lease with its own outcome, exactly as
its own request's.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

from minions.agents.macos import awake, hardware
from minions.agents.macos.claim_depth import ClaimDepth, Depth
from minions.agents.macos.client import (
    AuthError,
    ClientError,
    Conflict,
    ExecutorClient,
    NotFound,
    Rejected,
    StorageError,
)
from minions.agents.macos.config import AgentConfig
from minions.agents.macos.hardware import Hardware
from minions.agents.macos.jsonl import RecordsError, encode_outputs, parse_records
from minions.agents.macos.policy import OwnerPolicy
from minions.agents.macos.protocol import Claim, ProtocolError, Registration
from minions.agents.macos.runners.base import (
    ChoosesPrecision,
    PermanentError,
    ReportsFingerprints,
    Runner,
    RunnerError,
)
from minions.agents.macos.runners.registry import build_runners, uses_torch
from minions.logging import get_logger
from minions.protocol import MAX_TOKENS, LeaseCompletion

log = get_logger(__name__)

EXIT_OK = 0
# EX_CONFIG: a bad token or configuration. The systemd unit does not restart on it (a restart
# loop cannot fix a token), and launchd throttles it.
EXIT_CONFIG = 78
MAX_ERROR_CHARS = 4000

# A complete waits this long (at most) for others while more are on their way (leases still held
# that have not completed): one request for several on a fast device, where a request per subtask
# cost the API more than the subtask cost the device. Small beside any lease, and beside a slow
# subtask; at most this much finished work is lost if the Mac vanishes meanwhile.
COMMIT_LINGER_S = 0.02
COMMIT_LINGER_COUNT = 8  # ... or until this many wait


@dataclass
class _Commit:
    """A complete waiting for its turn: one lease, its outcome to come (None: committed)."""

    token: str
    records: int
    seconds: float
    output: bytes | None
    outcome: asyncio.Future[Rejected | None]


@dataclass
class _Job:
    claim: Claim
    task: asyncio.Task[None]
    abort_reason: str | None = None  # owner | lost | cancelled | shutdown

    def abort(self, reason: str) -> None:
        if self.abort_reason is None and not self.task.done():
            self.abort_reason = reason
            self.task.cancel()


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
        self._registration: Registration | None = None
        self._jobs: dict[str, _Job] = {}
        self._max_leases = max_leases  # None: as deep as the measured durations call for
        self._depth = ClaimDepth()
        self._depth_logged: Depth | None = None
        self._queue_had_work = False  # the last claim brought work (so the next is answered at once)
        self._compute = asyncio.Semaphore(1)  # one runner at a time: the device is the bottleneck
        self._room = asyncio.Event()  # set when a job ends: the work loop may claim again
        self._awake: contextlib.AbstractAsyncContextManager[None] | None = None
        self._claiming: asyncio.Task[list[Claim]] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._fatal: asyncio.Future[None] | None = None  # a job's AuthError ends the agent
        self._commits: list[_Commit] = []  # completes waiting for the one in flight
        self._commit_added = asyncio.Event()
        self._in_commit: set[str] = set()  # leases whose complete is queued, in flight or being answered
        self._committing: asyncio.Task[None] | None = None
        self.completed = 0  # subtasks committed by this process, for logs and tests

    @property
    def registration(self) -> Registration:
        if self._registration is None:
            raise RuntimeError("the agent has not registered yet")
        return self._registration

    def held_leases(self) -> list[str]:
        return list(self._jobs)

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
        heartbeat = asyncio.create_task(self._heartbeat_loop(), name="heartbeat")
        self._fatal = asyncio.get_running_loop().create_future()
        try:
            done, _ = await asyncio.wait({work, heartbeat, self._fatal}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a fatal error (a refused token) ends the agent
        finally:
            for task in (work, heartbeat):
                task.cancel()
            await asyncio.wait({work, heartbeat})  # work hands its lease back while it stops
            if self._committing is not None:  # no job is left to hear it
                self._committing.cancel()
                await asyncio.wait({self._committing})
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
        trips call for (claim_depth.py), logged as `claim_depth` whenever it changes (and once its
        figures are first measured)."""
        if self._max_leases is not None:
            return max(1, self._max_leases)
        depth = self.claim_depth()
        last = self._depth_logged
        if last is None or depth.leases != last.leases or (last.run_s is None) != (depth.run_s is None):
            log.info("claim_depth", leases=depth.leases, cap=depth.cap,
                     run_s=None if depth.run_s is None else round(depth.run_s, 4),
                     round_trip_s=None if depth.round_trip_s is None else round(depth.round_trip_s, 4))
            self._depth_logged = depth
        return depth.leases

    def claim_depth(self) -> Depth:
        """The claim-ahead depth the measurements call for, with the figures it comes from."""
        registration = self.registration
        return self._depth.depth(registration.heartbeat_interval_s, registration.max_claim)

    async def _work_loop(self) -> None:
        try:
            while True:
                await self._policy.wait_until_available(self._idle_poll_s)
                bound = self.lease_bound()
                room = bound - len(self._jobs)
                # While half the bound or more is still held (work queued for the device), wait until
                # half is free: one claim of many rather than a claim per finished subtask.
                if room <= 0 or (self._jobs and room < bound // 2):
                    self._room.clear()
                    await self._room.wait()
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
        registration = self.registration
        sent = time.monotonic()
        try:
            if registration.max_claim > 1 and room > 1:
                claims = await self._client.claim_batch(registration.executor_id, registration.long_poll_s,
                                                        min(room, registration.max_claim))
            else:
                claim = await self._client.claim(registration.executor_id, registration.long_poll_s)
                claims = [] if claim is None else [claim]
            if claims and self._queue_had_work:
                self._depth.claimed(time.monotonic() - sent)
            self._queue_had_work = bool(claims)
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

    async def _start(self, claim: Claim) -> None:
        """A job for the lease, watched until it ends (the machine kept awake while any runs)."""
        if not self._jobs:
            self._awake = self._keep_awake()
            await self._awake.__aenter__()
        job = _Job(claim, asyncio.create_task(self._execute(claim), name=f"subtask {claim.subtask.label}"))
        self._jobs[claim.token] = job
        self._background(self._supervise(job), f"supervise {claim.subtask.label}")
        if len(self._jobs) == 1:
            self._background(self._watch_owner(), "owner-watch")

    def _background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    async def _supervise(self, job: _Job) -> None:
        await asyncio.wait({job.task})
        try:
            await self._settle(job)
        except AuthError as exc:
            if self._fatal is not None and not self._fatal.done():
                self._fatal.set_exception(exc)
        finally:
            self._jobs.pop(job.claim.token, None)
            self._room.set()
            if not self._jobs and self._awake is not None:
                awake, self._awake = self._awake, None
                await awake.__aexit__(None, None, None)

    async def _stop_jobs(self, reason: str) -> None:
        """Abort every job and wait until each has been handed back (or dropped)."""
        jobs = list(self._jobs.values())
        for job in jobs:
            job.abort(reason)
        deadline = time.monotonic() + self._hand_back_timeout_s + 1
        while self._jobs and time.monotonic() < deadline:
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), max(0.0, deadline - time.monotonic()))

    async def _settle(self, job: _Job) -> None:
        label = job.claim.subtask.label
        if job.task.cancelled():
            if job.abort_reason in ("owner", "shutdown"):
                await self._hand_back(job.claim, job.abort_reason)
            else:
                log.info("subtask_dropped", subtask=label, reason=job.abort_reason)
            return
        exc = job.task.exception()
        if isinstance(exc, AuthError):
            raise exc
        if exc is not None:
            log.error("subtask_crashed", subtask=label, error=repr(exc))

    async def _hand_back(self, claim: Claim, reason: str) -> None:
        try:
            await asyncio.wait_for(self._client.release(claim.token), self._hand_back_timeout_s)
            log.info("subtask_released", subtask=claim.subtask.label, reason=reason)
        except Conflict:
            log.info("subtask_already_gone", subtask=claim.subtask.label, reason=reason)
        except (ClientError, TimeoutError) as exc:
            log.warning("release_failed", subtask=claim.subtask.label, error=str(exc) or type(exc).__name__)

    # -- one subtask --------------------------------------------------------------------------

    async def _execute(self, claim: Claim) -> None:
        sub = claim.subtask
        started = time.monotonic()
        log.info("subtask_started", subtask=sub.label, kind=sub.kind, model=sub.model, records=sub.input.records)
        try:
            runner = self._runners.get(sub.kind)
            if runner is None:
                raise PermanentError(f"this executor does not serve kind {sub.kind!r}")
            records = parse_records(await self._client.download(sub.input), sub.input.records)
            fetched = time.monotonic() - started
            async with self._compute:
                computing = time.monotonic()
                outputs = await runner.run(sub, records)
                computed = time.monotonic()
            self._depth.ran((sub.team, sub.project, sub.task_name), computed - computing)
            output = encode_outputs(records, outputs)
            if len(output) <= self.registration.inline_output_bytes:
                await self._complete(claim, len(records), time.monotonic() - started, output)
                self._depth.outside_runner(fetched + time.monotonic() - computed)
                return
            await self._client.upload(sub.output_url, output)
        except AuthError:
            raise
        except (RunnerError, RecordsError) as exc:
            await self._fail(claim, str(exc), retryable=isinstance(exc, RunnerError) and exc.retryable)
        except StorageError as exc:
            await self._fail(claim, str(exc), retryable=True)
        except Exception as exc:  # a crash in a runner (out of memory, a torch error): try elsewhere
            log.exception("runner_error", subtask=sub.label)
            await self._fail(claim, f"{type(exc).__name__}: {exc}", retryable=True)
        else:
            await self._complete(claim, len(records), time.monotonic() - started)
            self._depth.outside_runner(fetched + time.monotonic() - computed)

    async def _complete(self, claim: Claim, records: int, seconds: float, output: bytes | None = None) -> None:
        try:
            await self._commit(claim.token, records, seconds, output)
        except Conflict as exc:
            # 409 lease_lost: the subtask was reclaimed meanwhile; our output is ignored (fencing).
            log.warning("complete_refused", subtask=claim.subtask.label, error=str(exc))
            return
        except Rejected as exc:
            # 422 output_mismatch: the server found the output does not answer the records. Nothing
            # was committed and the lease is still ours: fail it now (another attempt may do better)
            # rather than leave it to the lease timeout.
            log.warning("complete_refused", subtask=claim.subtask.label, error=str(exc))
            await self._fail(claim, str(exc), retryable=True)
            return
        self.completed += 1
        log.info("subtask_completed", subtask=claim.subtask.label, records=records, seconds=round(seconds, 3))

    async def _commit(self, token: str, records: int, seconds: float, output: bytes | None) -> None:
        """Complete one lease. While other leases are still at work it waits a moment for their
        completes (COMMIT_LINGER_S), and while another complete is in flight it waits for that one:
        every complete that came meanwhile goes in one batched request (alone, its own request). Raises as
        its own request would (Conflict, Rejected, AuthError). Cancelled before it was sent, it is
        never sent (the job hands the lease back or drops it, as before). A server before the
        batched protocol (max_claim 1) gets each complete as its own request, at once."""
        self._in_commit.add(token)
        try:
            if self.registration.max_claim <= 1:
                await self._client.complete(token, records, seconds, output)
                return
            commit = _Commit(token, records, seconds, output, asyncio.get_running_loop().create_future())
            self._commits.append(commit)
            self._commit_added.set()
            if self._committing is None or self._committing.done():
                self._committing = asyncio.create_task(self._send_commits(), name="complete")
            refused = await commit.outcome
        finally:
            self._in_commit.discard(token)
        if refused is not None:
            raise refused

    async def _linger(self) -> None:
        """Before a request: up to COMMIT_LINGER_S for more completes, while more are coming (a held
        lease has not completed yet) and fewer than COMMIT_LINGER_COUNT wait."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COMMIT_LINGER_S
        while len(self._commits) < COMMIT_LINGER_COUNT and len(self._jobs) > len(self._in_commit):
            left = deadline - loop.time()
            if left <= 0:
                return
            self._commit_added.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._commit_added.wait(), left)

    async def _send_commits(self) -> None:
        while self._commits:
            try:
                await self._linger()
            except asyncio.CancelledError:
                for c in self._commits:  # never sent: their jobs hear it, as a request cut short does
                    c.outcome.cancel()
                raise
            batch = [c for c in self._commits[:MAX_TOKENS] if not c.outcome.done()]  # done: its job was cancelled
            del self._commits[:MAX_TOKENS]
            if not batch:
                continue
            try:
                if len(batch) == 1:
                    one = batch[0]
                    try:
                        await self._client.complete(one.token, one.records, one.seconds, one.output)
                        outcomes: dict[str, Rejected | None] = {one.token: None}
                    except Rejected as exc:
                        outcomes = {one.token: exc}
                else:
                    outcomes = await self._client.complete_batch([
                        LeaseCompletion(token=c.token, records=c.records, seconds=round(c.seconds, 3),
                                        output=None if c.output is None else c.output.decode())
                        for c in batch])
            except Exception as exc:  # AuthError, a malformed answer: every lease of the request hears it
                for c in batch:
                    if not c.outcome.done():
                        c.outcome.set_exception(exc)
                continue
            except asyncio.CancelledError:
                for c in batch:
                    c.outcome.cancel()
                raise
            for c in batch:
                if not c.outcome.done():
                    missing = Conflict(409, "lease_lost", "the answer had no outcome for this lease")
                    c.outcome.set_result(outcomes.get(c.token, missing))

    async def _fail(self, claim: Claim, error: str, retryable: bool) -> None:
        log.warning("subtask_failed", subtask=claim.subtask.label, error=error, retryable=retryable)
        try:
            await self._client.fail(claim.token, error[:MAX_ERROR_CHARS], retryable)
        except Rejected as exc:
            log.warning("fail_refused", subtask=claim.subtask.label, error=str(exc))

    # -- watchers -----------------------------------------------------------------------------

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
                for job in list(self._jobs.values()):
                    log.info("owner_needs_machine", subtask=job.claim.subtask.label, reason=verdict.reason)
                    job.abort("owner")
                return

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.registration.heartbeat_interval_s)
            tokens = self.held_leases()
            try:
                states, input_urls = await self._client.heartbeat(self.registration.executor_id, tokens)
            except Conflict as exc:
                states, input_urls = dict.fromkeys(tokens, "lost"), {}
                log.warning("heartbeat_refused", error=str(exc))
            except Rejected as exc:
                log.warning("heartbeat_refused", error=str(exc))
                continue
            for token, url in input_urls.items():
                # A renewed lease's fresh input URL: its download (or a retry of it) reads it from here.
                if (renewed := self._jobs.get(token)) is not None:
                    renewed.claim.subtask.input.url = url
            for token, state in states.items():
                job = self._jobs.get(token)
                # A lease whose complete is in flight is left to that complete's answer: the server
                # answers "lost" for a lease it has just committed (it is no longer leased), and
                # aborting then would drop a subtask that is done. (A job that has ended is only
                # waiting to leave _jobs.)
                if job is not None and not job.task.done() and state != "ok" and token not in self._in_commit:
                    log.info("lease_gone", subtask=job.claim.subtask.label, state=state)
                    job.abort(state)


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
    precisions = ", ".join(f"{p['model']} {p['precision']} (cosine {p['cosine']:.5f})" for p in precision) or "-"
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


async def discover_models(config: AgentConfig, runners: Mapping[str, Runner]) -> list[str]:
    """The configured models plus those the runners find locally, without duplicates."""
    found = await asyncio.gather(*(r.advertised_models() for r in runners.values()))
    return list(dict.fromkeys([*config.models, *(m for models in found for m in models)]))


async def prepare_models(runners: Mapping[str, Runner]) -> None:
    """Load the models the runners hold locally before registering, so that their precision (chosen
    at load) is reported at registration; a model that fails to load is left to the first subtask."""
    for runner in runners.values():
        if not isinstance(runner, ChoosesPrecision):
            continue
        for model in await runner.advertised_models():
            try:
                await runner.prepare(model)
            except RunnerError as exc:
                log.warning("model_prepare_failed", model=model, error=str(exc))


async def serve(config: AgentConfig) -> int:
    """Run an agent until SIGINT/SIGTERM (exit 0) or a refused token (exit 78)."""
    main = asyncio.current_task()
    assert main is not None
    # Handlers first: a SIGTERM during the (seconds-long) torch probe must still exit cleanly.
    stopping = _install_signal_handlers(main)
    runners: dict[str, Runner] = {}
    try:
        machine = await asyncio.to_thread(hardware.detect, config.device, uses_torch(config))
        runners = build_runners(config, machine.device)
        models = await discover_models(config, runners)
        await prepare_models(runners)
        async with ExecutorClient(config.api_url, config.token) as client:
            agent = Agent(config, client, runners, OwnerPolicy(config.policy), machine, models,
                          max_leases=config.max_leases)
            await agent.run()
        return EXIT_OK
    except asyncio.CancelledError:
        if not stopping():
            raise
        main.uncancel()
        log.info("agent_stopped")
        return EXIT_OK
    except AuthError as exc:
        log.error("token_refused", error=str(exc))
        return EXIT_CONFIG
    except Rejected as exc:
        # Only registration lets a 4xx escape (e.g. 422: a preference outside the token's team);
        # restarting cannot fix the configuration, so this is a configuration exit too.
        log.error("registration_rejected", error=f"the API rejected this agent's registration: {exc}")
        return EXIT_CONFIG
    finally:
        _remove_signal_handlers()
        await asyncio.gather(*(r.aclose() for r in runners.values()), return_exceptions=True)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _install_signal_handlers(main: asyncio.Task[Any]) -> Callable[[], bool]:
    """The first SIGINT/SIGTERM cancels the main task (which hands work back and deregisters);
    later ones are ignored so the clean-up is not cut short."""
    state = {"stopping": False}

    def on_signal(name: str) -> None:
        if state["stopping"]:
            log.info("agent_already_stopping", signal=name)
            return
        state["stopping"] = True
        log.info("agent_stopping", signal=name)
        main.cancel()

    loop = asyncio.get_running_loop()
    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig.name)
    return lambda: state["stopping"]


def _remove_signal_handlers() -> None:
    loop = asyncio.get_running_loop()
    for sig in _SIGNALS:
        loop.remove_signal_handler(sig)
