"""The API's memory of the leases it handed out (services/api/leasing/lease_facts.py): bounded in leases and
in the inline input bytes it keeps, the oldest dropped first."""

from __future__ import annotations

import uuid
from typing import Any

from minions.services.api.leasing.lease_facts import LeaseFacts


def _row(n: int) -> dict[str, Any]:
    return {"lease_token": uuid.UUID(int=n), "owner": 1, "output_key": f"outputs/{n}", "task_id": 1,
            "subtask_id": n, "attempt": 1, "kind": "sleep", "input_uri": "file:///in", "byte_start": 0,
            "byte_end": 10, "records": 1}


def test_inputs_are_kept_within_their_byte_budget_oldest_dropped_first() -> None:
    facts = LeaseFacts(capacity=10, input_bytes=25)
    for n in range(3):
        facts.remember(_row(n), b"x" * 10)
    # Room for two inputs of 10 bytes: the oldest input went, its facts stay.
    assert [facts.input_of(uuid.UUID(int=n)) for n in range(3)] == [None, b"x" * 10, b"x" * 10]
    assert facts.get(uuid.UUID(int=0)) is not None
    facts.forget(uuid.UUID(int=1))  # its bytes are room again
    facts.remember(_row(3), b"y" * 10)
    assert facts.input_of(uuid.UUID(int=2)) == b"x" * 10 and facts.input_of(uuid.UUID(int=3)) == b"y" * 10
    facts.remember(_row(4), b"z" * 26)  # larger than the whole budget: not kept, nothing dropped
    assert facts.input_of(uuid.UUID(int=4)) is None and facts.input_of(uuid.UUID(int=2)) == b"x" * 10


def test_the_oldest_leases_are_forgotten_past_capacity_with_their_inputs() -> None:
    facts = LeaseFacts(capacity=2, input_bytes=100)
    for n in range(3):
        facts.remember(_row(n), b"x" * 10)
    assert facts.get(uuid.UUID(int=0)) is None and facts.input_of(uuid.UUID(int=0)) is None
    assert facts.get(uuid.UUID(int=2))["subtask_id"] == 2  # type: ignore[index]
    for n in range(3, 20):  # the room freed with each forgotten lease is reused
        facts.remember(_row(n), b"x" * 10)
    assert facts.input_of(uuid.UUID(int=19)) == b"x" * 10
