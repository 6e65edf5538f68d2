"""Waiting on state that changes in other tasks and other processes: a poll is the honest wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
WAIT_S = 30.0  # generous: the machines running these tests are shared and noisy


async def eventually(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = WAIT_S,
                     interval_s: float = 0.05) -> T:
    """The first truthy value of `check`, polled until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {value!r})")
        await asyncio.sleep(interval_s)
