"""Reconnect delays: exponential with jitter, so splitters that lost the same database do not all
come back in the same millisecond."""

from __future__ import annotations

import asyncio
import random


class Backoff:
    def __init__(self, first_s: float = 0.2, max_s: float = 10.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self._next_s = first_s

    def reset(self) -> None:
        self._next_s = self.first_s

    def next_delay(self) -> float:
        delay = self._next_s * random.uniform(0.5, 1.0)
        self._next_s = min(self._next_s * 2, self.max_s)
        return delay

    async def sleep(self) -> None:
        await asyncio.sleep(self.next_delay())
