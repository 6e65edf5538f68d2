"""Deadlines of the executors that hold a lease: when each one's silence becomes a loss."""

from __future__ import annotations

import time
import uuid


class Deadlines:
    """executor id -> monotonic deadline. Only lease holders are tracked."""

    def __init__(self) -> None:
        self._at: dict[uuid.UUID, float] = {}

    def track(self, executor_id: uuid.UUID, remaining_s: float) -> None:
        self._at[executor_id] = time.monotonic() + max(0.0, remaining_s)

    def forget(self, executor_id: uuid.UUID) -> None:
        self._at.pop(executor_id, None)

    def replace_all(self, remaining: dict[uuid.UUID, float]) -> None:
        self._at.clear()
        for executor_id, seconds in remaining.items():
            self.track(executor_id, seconds)

    def due(self) -> list[uuid.UUID]:
        now = time.monotonic()
        return [e for e, at in self._at.items() if at <= now]

    def seconds_to_next(self) -> float | None:
        if not self._at:
            return None
        return max(0.0, min(self._at.values()) - time.monotonic())

    def __len__(self) -> int:
        return len(self._at)
