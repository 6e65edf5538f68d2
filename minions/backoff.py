"""The one retry delay: exponential with "equal jitter" (half fixed, half random), so a fleet that
lost the same server at the same moment spreads its retries out, yet no retry comes at once."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    first_s: float = 0.2
    max_s: float = 10.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    _attempt: int = field(default=0, init=False)

    def delay(self, attempt: int) -> float:
        """Delay before retry number `attempt` (0-based), without touching the running count."""
        ceiling = min(self.max_s, self.first_s * self.factor ** min(attempt, 64))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)

    def next_delay(self) -> float:
        delay = self.delay(self._attempt)
        self._attempt += 1
        return delay

    def reset(self) -> None:
        self._attempt = 0

    async def sleep(self) -> None:
        await asyncio.sleep(self.next_delay())
