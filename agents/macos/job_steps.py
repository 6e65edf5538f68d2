"""The steps of one job: fetch its lease's input, run it, upload the output unless it rides inline
in the complete, and complete; or fail the lease. Each step moves the job to its state (jobs.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from minions.agents.macos.claim_depth import ClaimDepth
from minions.agents.macos.client import AuthError, Conflict, ExecutorClient, Rejected, StorageError
from minions.agents.macos.completes import Completes
from minions.agents.macos.jobs import IllegalTransition, Job, JobState
from minions.agents.macos.jsonl import RecordsError, encode_outputs, parse_records
from minions.agents.macos.protocol import Registration
from minions.agents.macos.runners.base import PermanentError, Runner, RunnerError
from minions.logging import get_logger
from minions.protocol import MAX_ERROR_CHARS

log = get_logger(__name__)



class JobSteps:
    def __init__(
        self,
        client: ExecutorClient,
        runners: Mapping[str, Runner],
        completes: Completes,
        depth: ClaimDepth,
        registration: Callable[[], Registration],
    ) -> None:
        """`depth` hears how long each step took; `registration` is read at each job (the agent
        registers again when the server forgets it)."""
        self._client = client
        self._runners = runners
        self._completes = completes
        self._depth = depth
        self._registration = registration
        self._compute = asyncio.Semaphore(1)  # one runner at a time: the device is the bottleneck
        self.completed = 0  # subtasks committed, for logs and tests

    async def run(self, job: Job) -> None:
        """Fetch the input, run it, upload the output unless it rides inline, complete; or fail."""
        sub = job.claim.subtask
        started = time.monotonic()
        log.info("subtask_started", subtask=sub.label, kind=sub.kind, model=sub.model, records=sub.input.records)
        try:
            runner = self._runners.get(sub.kind)
            if runner is None:
                raise PermanentError(f"this executor does not serve kind {sub.kind!r}")
            records = parse_records(await self._client.download(sub.input), sub.input.records)
            self._depth.fetched(time.monotonic() - started)
            async with self._compute:
                job.move(JobState.RUNNING)
                computing = time.monotonic()
                outputs = await runner.run(sub, records)
                computed = time.monotonic()
            self._depth.ran((sub.team, sub.project, sub.task_name), computed - computing)
            output = encode_outputs(records, outputs)
            inline = len(output) <= self._registration().inline_output_bytes
            if not inline:
                job.move(JobState.UPLOADING)
                await self._client.upload(sub.output_url, output)
        except (AuthError, IllegalTransition):
            raise
        except (RunnerError, RecordsError) as exc:
            await self._fail(job, str(exc), retryable=isinstance(exc, RunnerError) and exc.retryable)
        except StorageError as exc:
            await self._fail(job, str(exc), retryable=True)
        except Exception as exc:  # a crash in a runner (out of memory, a torch error): try elsewhere
            log.exception("runner_error", subtask=sub.label)
            await self._fail(job, f"{type(exc).__name__}: {exc}", retryable=True)
        else:
            await self._complete(job, len(records), time.monotonic() - started, output if inline else None)
            self._depth.committed(time.monotonic() - computed)

    async def _complete(self, job: Job, records: int, seconds: float, output: bytes | None) -> None:
        job.move(JobState.COMMITTING)
        try:
            await self._completes.complete(job.token, records, seconds, output)
        except Conflict as exc:
            # 409 lease_lost: the subtask was reclaimed meanwhile; our output is ignored (fencing).
            log.warning("complete_refused", subtask=job.label, error=str(exc))
            job.move(JobState.DROPPED)
            return
        except Rejected as exc:
            # 422 output_mismatch: the server found the output does not answer the records. Nothing
            # was committed and the lease is still ours: fail it now (another attempt may do better)
            # rather than leave it to the lease timeout.
            log.warning("complete_refused", subtask=job.label, error=str(exc))
            await self._fail(job, str(exc), retryable=True)
            return
        job.move(JobState.DONE)
        self.completed += 1
        log.info("subtask_completed", subtask=job.label, records=records, seconds=round(seconds, 3))

    async def _fail(self, job: Job, error: str, retryable: bool) -> None:
        job.move(JobState.FAILING)
        log.warning("subtask_failed", subtask=job.label, error=error, retryable=retryable)
        try:
            await self._client.fail(job.token, error[:MAX_ERROR_CHARS], retryable)
        except Rejected as exc:  # the lease is gone: nothing more to say about it
            log.warning("fail_refused", subtask=job.label, error=str(exc))
            job.move(JobState.DROPPED)
            return
        job.move(JobState.FAILED)
