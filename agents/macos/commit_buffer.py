"""A buffer that sends records in batches: when `size` of them wait, or once they have lingered
`linger_s`, or at once when no more are expected; one batch in flight at a time.

The agent's completes go through it: on a fast device a request per subtask cost the API more than
the subtask cost the device, and one request for several costs about one. The linger is short
beside any lease (at most that much finished work is lost if the Mac vanishes meanwhile) and is
skipped when nothing else is on its way, so a lone complete goes at once.

A flush that raises keeps its records, first in line, and is tried again after `retry_s` (the
error logged): the buffer loses nothing on its own. The flush function decides what each record's
outcome is; the agent's hands every record its answer and raises only on a bug.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from minions.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")


class CommitBuffer(Generic[T]):
    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[None]],
        *,
        size: int,
        linger_s: float,
        most: int,
        more_expected: Callable[[], bool] = lambda: True,
        retry_s: float = 1.0,
    ) -> None:
        """`flush` sends one batch of at most `most` records; `size` records waiting send at once;
        `more_expected` says whether lingering may gather more (False: send what waits now)."""
        if not 1 <= size <= most:
            raise ValueError(f"size {size} must be between 1 and most ({most})")
        self._flush = flush
        self._size = size
        self._linger_s = linger_s
        self._most = most
        self._more_expected = more_expected
        self._retry_s = retry_s
        self._items: list[T] = []
        self._added = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._closing = False

    def __len__(self) -> int:
        """Records waiting (not yet flushed, or kept by a failed flush)."""
        return len(self._items)

    def add(self, item: T) -> None:
        if self._closing:
            raise RuntimeError("the buffer is closed")
        self._items.append(item)
        self._added.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send(), name="commit-buffer")

    async def close(self, timeout_s: float | None = None) -> list[T]:
        """Flush what waits, without lingering, and the batch in flight; after `timeout_s` (None:
        no limit) the sender is cancelled instead. Returns the records never flushed (kept by a
        failed flush, or cut short by the timeout)."""
        self._closing = True
        self._added.set()  # a linger under way ends now
        sender = self._sender
        if sender is not None and not sender.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(sender), timeout_s)
            if not sender.done():
                sender.cancel()
                await asyncio.wait({sender})
        left, self._items = self._items, []
        return left

    async def _send(self) -> None:
        while self._items:
            await self._linger()
            batch = self._items[: self._most]
            del self._items[: self._most]
            try:
                await self._flush(batch)
            except asyncio.CancelledError:
                self._items[:0] = batch  # never answered: kept for close() to hand back
                raise
            except Exception:
                self._items[:0] = batch
                log.exception("commit_flush_failed", records=len(batch), retry_in_s=self._retry_s)
                if self._closing:
                    return
                await asyncio.sleep(self._retry_s)

    async def _linger(self) -> None:
        """Up to `linger_s` for more records, while fewer than `size` wait and more are expected."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._linger_s
        while len(self._items) < self._size and not self._closing and self._more_expected():
            left = deadline - loop.time()
            if left <= 0:
                return
            self._added.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._added.wait(), left)
