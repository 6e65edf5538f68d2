"""What the API learnt of each lease when it handed it out, so its complete needs no lookup first.

A claim's row holds everything a complete verifies against (the API token of the executor holding
the lease, its output key, the input range and records): facts fixed for the life of a lease token.
Kept here, a complete runs one statement (minion_complete) instead of two; a lease claimed through
another API process (or before a restart) is looked up with minion_lease_info as before. Whether the
lease is still current is never taken from here: the SQL functions fence every step.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from typing import Any

# Enough for every lease a busy cluster holds at once; the oldest are forgotten first.
CAPACITY = 50_000

FACTS = ("owner", "output_key", "task_id", "subtask_id", "attempt", "kind", "input_uri", "byte_start",
         "byte_end", "records")


class LeaseFacts:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._facts: OrderedDict[uuid.UUID, dict[str, Any]] = OrderedDict()
        self._capacity = capacity

    def remember(self, row: Any) -> None:
        """A claim's row (minion_claim_batch): the facts of its lease, in minion_lease_info's names."""
        facts = {name: row[name] for name in FACTS if name != "attempt"}
        facts["attempt"] = row["attempt"]
        self._facts[row["lease_token"]] = facts
        while len(self._facts) > self._capacity:
            self._facts.popitem(last=False)

    def get(self, token: uuid.UUID) -> dict[str, Any] | None:
        return self._facts.get(token)

    def forget(self, token: uuid.UUID) -> None:
        self._facts.pop(token, None)
