"""`SyncMinionsClient`: the SDK for scripts and notebooks, without `async`.

It runs an async `MinionsClient` on an event loop of its own, in a background thread. That is
what makes it work in Jupyter too, whose own loop already runs in the main thread (where
`asyncio.run` would refuse). Ctrl-C while waiting cancels the call on the loop; in `wait` it raises
`WaitInterrupted`, a KeyboardInterrupt whose message says that the task keeps running and how to
wait again or cancel it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from minions.sdk.client import MinionsClient, WaitInterrupted, connection_settings
from minions.sdk.inputs import InputSource
from minions.sdk.objects import Result, Task, TaskRef, task_parts
from minions.sdk.results import Results
from minions.sdk.tables import TableSource

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

T = TypeVar("T")
RESULTS_PER_HOP = 1000  # results handed from the loop's thread to the caller's at a time


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="minions-sdk", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:  # Ctrl-C in the caller's thread: stop the work on the loop too
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncMinionsClient:
    """The same calls as `MinionsClient`'s typed layer, blocking: `submit`, `get_task`, `wait`,
    `iter_results`, `cancel`, `retry`, `executors`. Use as `with SyncMinionsClient.from_env() as minions:`."""

    def __init__(self, api_url: str, token: str, **kwargs: Any) -> None:
        self._loop = _LoopThread()
        self._client = MinionsClient(api_url, token, **kwargs)

    @classmethod
    def from_env(cls, data_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> SyncMinionsClient:
        """MINIONS_API_URL / MINIONS_TOKEN, else the up.json of a local `minions up`."""
        api_url, token = connection_settings(data_dir)
        return cls(api_url, token, **kwargs)

    def __enter__(self) -> SyncMinionsClient:
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run(self._client.close())
        self._loop.stop()

    def submit(self, records: InputSource | TableSource, *, team: str, project: str, name: str, kind: str,
               model: str | None = None, params: Mapping[str, Any] | None = None, priority: int = 0,
               subtask_size: int | None = None, id_column: str = "id", text_column: str | None = None,
               placement: str = "any") -> Task:
        """Upload `records` (a JSONL or Parquet path, JSONL bytes, an iterable of dicts, a DataFrame,
        an Arrow table or a Hugging Face Dataset), each checked first, and submit a task on them."""
        return self._loop.run(self._client.submit(records, team=team, project=project, name=name, kind=kind,
                                                  model=model, params=params, priority=priority,
                                                  subtask_size=subtask_size, id_column=id_column,
                                                  text_column=text_column, placement=placement))

    def get_task(self, ref: TaskRef) -> Task:
        return self._loop.run(self._client.get_task(ref))

    def wait(self, ref: TaskRef, *, progress: bool = False, interval_s: float = 0.5,
             timeout_s: float | None = None) -> Task:
        """The task once it has ended; with `progress`, a progress bar on stderr meanwhile. Ctrl-C (or
        a notebook's interrupt) stops the waiting, not the task: `WaitInterrupted`, which says so."""
        try:
            return self._loop.run(self._client.wait(ref, progress=progress, interval_s=interval_s,
                                                    timeout_s=timeout_s))
        except KeyboardInterrupt:
            raise WaitInterrupted("/".join(task_parts(ref))) from None

    def iter_results(self, ref: TaskRef, *, partial: bool = False) -> Iterator[Result]:
        """One typed result per input record, in input order, streamed."""
        results = self._client.iter_results(ref, partial=partial)
        try:
            while batch := self._loop.run(_next_batch(results)):
                yield from batch
        finally:
            self._loop.run(results.aclose())

    def results(self, ref: TaskRef, *, partial: bool = False) -> SyncResults:
        """The task's results: iterate the typed records, or `to_numpy()`, `to_arrow()`,
        `to_pandas()`, `write(path)` (minions.sdk.results)."""
        return SyncResults(self, self._client.results(ref, partial=partial), ref, partial)

    def cancel(self, ref: TaskRef) -> Task:
        async def cancel() -> Task:
            return Task.from_json(await self._client.cancel(*task_parts(ref)))
        return self._loop.run(cancel())

    def retry(self, ref: TaskRef) -> Task:
        """Run a failed task's failed subtasks again; its committed results stay. `wait` for it again."""
        async def retry() -> Task:
            return Task.from_json(await self._client.retry(*task_parts(ref)))
        return self._loop.run(retry())

    def executors(self, team: str | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.executors(team))


class SyncResults:
    """`Results` (minions.sdk.results) without `async`: the same methods, blocking."""

    def __init__(self, owner: SyncMinionsClient, results: Results, ref: TaskRef, partial: bool) -> None:
        self._owner = owner
        self._results = results
        self._ref = ref
        self._partial = partial

    @property
    def failed(self) -> np.ndarray[Any, np.dtype[np.bool_]] | None:
        """After a to_* call with allow_failed: True where a record failed."""
        return self._results.failed

    def __iter__(self) -> Iterator[Result]:
        return self._owner.iter_results(self._ref, partial=self._partial)

    def to_numpy(self, *, allow_failed: bool = False) -> np.ndarray[Any, np.dtype[np.float32]]:
        return self._owner._loop.run(self._results.to_numpy(allow_failed=allow_failed))

    def to_arrow(self, *, allow_failed: bool = False) -> pa.Table:
        return self._owner._loop.run(self._results.to_arrow(allow_failed=allow_failed))

    def to_pandas(self, *, allow_failed: bool = False) -> pd.DataFrame:
        return self._owner._loop.run(self._results.to_pandas(allow_failed=allow_failed))

    def write(self, path: str | os.PathLike[str], *, allow_failed: bool = False) -> int:
        return self._owner._loop.run(self._results.write(path, allow_failed=allow_failed))


async def _next_batch(results: AsyncIterator[Result]) -> list[Result]:
    batch: list[Result] = []
    async for result in results:
        batch.append(result)
        if len(batch) >= RESULTS_PER_HOP:
            break
    return batch
