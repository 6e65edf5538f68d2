"""What the API learnt of each lease when it handed it out, so its complete needs no lookup first.

A claim's row holds everything a complete verifies against (the API token of the executor holding
the lease, its output key, the input range and records): facts fixed for the life of a lease token.
Kept here, a complete runs one statement (minion_complete) instead of two; a lease claimed through
another API process (or before a restart) is looked up with minion_lease_info. Whether the
lease is still current is never taken from here: the SQL functions fence every step.

The input bytes a claim read to send inline are kept too (up to INPUT_BYTES in all, the oldest
dropped first), so that the complete checks the output against them without reading the input
range again.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

# Enough for every lease a busy cluster holds at once; the oldest are forgotten first.
CAPACITY = 50_000
# The inline inputs kept beside them, in all (a lease past it is checked against a fresh read).
INPUT_BYTES = 64 * 1024 * 1024

FACTS = ("owner", "output_key", "task_id", "subtask_id", "attempt", "kind", "input_uri", "byte_start",
         "byte_end", "records")


class LeaseFacts:
    def __init__(self, capacity: int = CAPACITY, input_bytes: int = INPUT_BYTES) -> None:
        self._facts: OrderedDict[uuid.UUID, dict[str, Any]] = OrderedDict()
        self._inputs: dict[uuid.UUID, bytes] = {}
        self._capacity = capacity
        self._input_bytes = input_bytes
        self._input_room = input_bytes

    def remember(self, row: Any, input_data: bytes | None = None) -> None:
        """A claim's row (minion_claim_batch): the facts of its lease, in minion_lease_info's names;
        `input_data`: its input range's bytes, when the claim read them."""
        token = row["lease_token"]
        facts = {name: row[name] for name in FACTS if name != "attempt"}
        facts["attempt"] = row["attempt"]
        self.forget(token)
        self._facts[token] = facts
        if input_data is not None and len(input_data) <= self._input_bytes:
            while len(input_data) > self._input_room:  # the oldest inputs make room (a fresh read then)
                self._input_room += len(self._inputs.pop(next(iter(self._inputs))))
            self._inputs[token] = input_data
            self._input_room -= len(input_data)
        while len(self._facts) > self._capacity:
            self.forget(next(iter(self._facts)))

    def get(self, token: uuid.UUID) -> dict[str, Any] | None:
        return self._facts.get(token)

    def input_of(self, token: uuid.UUID) -> bytes | None:
        """The input range's bytes as the claim read them, if kept."""
        return self._inputs.get(token)

    def forget(self, token: uuid.UUID) -> None:
        self._facts.pop(token, None)
        data = self._inputs.pop(token, None)
        if data is not None:
            self._input_room += len(data)
