"""The synthetic `sleep` kind: each record `{"id", "ms"}` waits that long (capacity tests, drills)."""

from __future__ import annotations

import asyncio

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners.base import PermanentError, Record


class SleepRunner:
    kind = "sleep"

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        outputs = []
        for record in records:
            ms = record.get("ms")
            if isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
                raise PermanentError(f"record {record.get('id')!r}: ms must be a number >= 0")
            # Waiting is I/O-like: it may stay on the event loop, and cancelling it is immediate.
            await asyncio.sleep(ms / 1000)
            outputs.append({"id": record["id"], "slept_ms": ms})
        return outputs

    async def advertised_models(self) -> list[str]:
        return []

    async def aclose(self) -> None:
        return None
