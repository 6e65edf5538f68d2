"""Bounded, ordered read-ahead: fetch up to `width` items at once, hand the results back in order.

Results of many small objects (one per subtask) are latency-bound, a round trip each on S3: reading
the next few while the current one is sent hides that latency without reordering anything."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def ordered(items: AsyncIterable[T], fetch: Callable[[T], Awaitable[R]], width: int) -> AsyncGenerator[R, None]:
    """`fetch(item)` for each item, at most `width` running at once, results yielded in item order.
    An error of one fetch is raised when its turn comes; the fetches still running are cancelled
    when the caller stops early or an error is raised."""
    pending: deque[asyncio.Task[R]] = deque()
    source = aiter(items)
    exhausted = False
    try:
        while True:
            while not exhausted and len(pending) < max(1, width):
                try:
                    item = await anext(source)
                except StopAsyncIteration:
                    exhausted = True
                else:
                    pending.append(asyncio.ensure_future(fetch(item)))
            if not pending:
                return
            yield await pending.popleft()
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(BaseException):
                await task
