"""Subtask input and output bodies: JSON lines, one record a line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minions import jsoncodec


class RecordsError(ValueError):
    """An input range or a runner's output does not hold the records it should: permanent."""


def parse_records(body: bytes, expected: int) -> list[dict[str, Any]]:
    """The records of an input range; blank lines are skipped, the count must be `expected`."""
    records: list[dict[str, Any]] = []
    for number, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            record = jsoncodec.loads(line)
        except jsoncodec.JSONDecodeError as exc:
            raise RecordsError(f"input line {number} is not JSON: {exc}") from exc
        if not isinstance(record, dict) or "id" not in record:
            raise RecordsError(f"input line {number} is not a record with an id")
        records.append(record)
    if len(records) != expected:
        raise RecordsError(f"input range holds {len(records)} records, the subtask says {expected}")
    return records


def encode_outputs(records: Sequence[dict[str, Any]], outputs: Sequence[dict[str, Any]]) -> bytes:
    """The output object: one line per input record, in input order (checked, since a runner bug
    here would silently attach results to the wrong ids)."""
    if len(outputs) != len(records):
        raise RecordsError(f"runner returned {len(outputs)} results for {len(records)} records")
    for record, output in zip(records, outputs, strict=True):
        if output.get("id") != record["id"]:
            raise RecordsError(f"runner returned id {output.get('id')!r} where {record['id']!r} belongs")
    return b"".join(jsoncodec.dumps_line(output) for output in outputs)
