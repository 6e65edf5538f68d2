"""What every runner is, what it may raise, and the worker thread inference runs on."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar, runtime_checkable

from minions.agents.macos.protocol import Subtask
from minions.kinds import PARAMS, params_problems

T = TypeVar("T")
Record = dict[str, Any]


class RunnerError(Exception):
    """A subtask failed; another attempt (maybe on another executor) may succeed."""

    retryable = True


class PermanentError(RunnerError):
    """A subtask cannot succeed anywhere as asked (unknown model, bad params or records)."""

    retryable = False


class Interrupted(Exception):
    """Raised on the worker thread when the agent asked it to stop (lease lost, owner back)."""


class Runner(Protocol):
    kind: str

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        """One output record per input record, in input order."""

    async def advertised_models(self) -> list[str]:
        """Models this runner holds locally, to advertise at registration."""

    async def aclose(self) -> None:
        """Free the runner's resources."""


@runtime_checkable
class ChoosesPrecision(Protocol):
    """A runner that picks a precision per model at load (the embedding runner)."""

    async def prepare(self, model_name: str) -> Any:
        """Load `model_name` now, choosing its precision (and batch size)."""

    def precision_reports(self) -> list[dict[str, Any]]:
        """Per model loaded so far: model, device, precision, cosine to fp32, setting."""


@runtime_checkable
class ReportsFingerprints(Protocol):
    """A runner that tells which model it serves under each name (registration's `fingerprints`)."""

    async def fingerprints(self, models: Sequence[str]) -> list[dict[str, Any]]:
        """{model, fingerprint, precision, backend} for each of `models` it finds on this machine."""


class InferenceThread:
    """A single worker thread for one runner's inference.

    Inference never runs on the event loop (heartbeats and the owner-policy watch must keep
    going), and models are only ever touched from this one thread, so a runner's model cache needs
    no lock. Work is cancellable: cancelling `call` sets the stop event the work polls between
    batches, and waits until the thread has really stopped, so a following subtask never competes
    with a leftover one for the GPU.
    """

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"minions-{name}")

    async def call(self, work: Callable[[threading.Event], T]) -> T:
        stop = threading.Event()
        future = asyncio.get_running_loop().run_in_executor(self._executor, work, stop)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            stop.set()
            await asyncio.wait({future})
            with contextlib.suppress(BaseException):
                future.result()  # retrieved, so asyncio does not log it as never retrieved
            raise

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Interrupted("stopped by the agent")


def require_model(subtask: Subtask) -> str:
    if not subtask.model:
        raise PermanentError(f"a {subtask.kind} subtask needs a model")
    return subtask.model


def string_field(record: Record, key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise PermanentError(f"record {record.get('id')!r}: {key} must be a string")
    return value


def checked_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params of a `kind` subtask this runner knows, each held to the API's rule (minions/kinds.py).
    Unknown ones are ignored: a newer server may send params an older agent does not use."""
    given = {name: value for name, value in params.items() if name in PARAMS[kind] and value is not None}
    for name, problem in params_problems(kind, given).items():
        raise PermanentError(f"params.{name} {problem}")
    return given
