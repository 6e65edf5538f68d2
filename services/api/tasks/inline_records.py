"""Inline records of a submission, checked by streaming: O(1) memory per record whatever the count.

The old path decoded the whole body into Python objects and kept a serialized copy of every record
(8.5 GB for a 63 MB body). Here the records stay encoded in the request body; ijson yields them one
at a time; each is checked (the same `check_record` the splitter applies to uploads), written as
one canonical JSONL line to a temporary file (what the store will hold), hashed, and remembered
for the duplicate check only as a 16-byte digest of its id (the splitter's `DuplicateIds` digest),
sorted once at the end.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import ijson
import numpy as np
import orjson

from minions.records import check_record

SPOOL_CHUNK = 1 << 20  # lines are written and hashed a chunk at a time
_COMPARE_SLICE = 1 << 18
_NOT_AN_ID = b"\xff" * 8  # an invalid record's digest: these 8 bytes, then its index


class BufferReader:
    """A read()-only file over a buffer, so ijson reads the records in place (no copy)."""

    def __init__(self, data: memoryview) -> None:
        self._data = data
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else min(len(self._data), self._at + size)
        chunk = bytes(self._data[self._at:end])
        self._at = end
        return chunk


@dataclass
class SpooledRecords:
    """The checked records as JSONL, in memory up to SPOOL_CHUNK bytes, beyond that in an anonymous
    temporary file (removed when closed, or when the process dies: it has no name)."""

    file: IO[bytes]
    size: int
    count: int

    def chunks(self) -> Iterator[bytes]:
        self.file.seek(0)
        while chunk := self.file.read(SPOOL_CHUNK):
            yield chunk

    def close(self) -> None:
        self.file.close()


@dataclass
class RecordScan:
    records: SpooledRecords
    problems: dict[int, str] = field(default_factory=dict)  # the first `max_listed`, by index
    problem_count: int = 0


class MalformedRecords(ValueError):
    """The records are not valid JSON (the message says where)."""


def scan_records(kind: str, encoded: memoryview, fingerprint: Any, max_listed: int) -> RecordScan:
    """Check every record of the (non-empty) JSON array `encoded`, spooling the valid ones as JSONL and feeding
    their lines to `fingerprint` (a hashlib object). Blocking: run it in a thread for big bodies."""
    # In memory up to a chunk: a small submission (scanned on the event loop) creates no file there.
    spool = SpooledRecords(tempfile.SpooledTemporaryFile(max_size=SPOOL_CHUNK), 0, 0)
    scan = RecordScan(spool)
    # 16 bytes per record, at its index, kept as two contiguous 8-byte columns: numpy sorts them
    # without copying either.
    high, low = bytearray(), bytearray()
    # One growing buffer, not a list of lines: a list holding ~40k small bytes objects between
    # flushes, interleaved with the parser's objects, left pymalloc's arenas fragmented (measured:
    # +200 bytes of RSS a record, never given back).
    pending = bytearray()

    def flush() -> None:
        fingerprint.update(pending)
        spool.file.write(pending)
        spool.size += len(pending)
        pending.clear()

    def refuse(index: int, problem: str) -> None:
        scan.problem_count += 1
        if len(scan.problems) < max_listed:
            scan.problems[index] = problem

    try:
        for index, record in enumerate(ijson.items(BufferReader(encoded), "item", use_float=True)):
            spool.count += 1
            problem = check_record(kind, record)
            if problem is None:
                try:
                    line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
                except orjson.JSONEncodeError as exc:
                    problem = (f"cannot be stored as JSON ({exc}): at most 255 levels of nesting and "
                               "integers of 64 bits")
            if problem is not None:
                refuse(index, problem)
                high += _NOT_AN_ID  # with its index: unique, never a duplicate
                low += index.to_bytes(8, "little")
                continue
            digest = hashlib.blake2b(orjson.dumps(record["id"]), digest_size=16).digest()
            high += digest[:8]
            low += digest[8:]
            pending += line
            if len(pending) >= SPOOL_CHUNK:
                flush()
    except ijson.JSONError as exc:
        spool.close()
        raise MalformedRecords(str(exc).splitlines()[0]) from None
    flush()
    duplicates, listed = duplicate_ids(high, low, encoded, max_listed)
    scan.problem_count += duplicates
    scan.problems = dict(sorted({**scan.problems, **listed}.items())[:max_listed])
    return scan


def duplicate_ids(high: bytearray, low: bytearray, encoded: memoryview,
                  max_listed: int) -> tuple[int, dict[int, str]]:
    """How many records repeat an earlier record's id, and the first `max_listed` of them as
    {index: "duplicate id X (first at index i)"}. `high` and `low` hold the two halves of each
    record's 16-byte id digest, by index."""
    his, los = np.frombuffer(high, dtype="<u8"), np.frombuffer(low, dtype="<u8")
    if len(his) < 2:
        return 0, {}
    order = np.lexsort((los, his))  # stable: equal ids stay in input order
    same = np.empty(len(his) - 1, dtype=bool)
    for start in range(0, len(same), _COMPARE_SLICE):  # a slice at a time: no sorted copy of the keys
        here = order[start:start + _COMPARE_SLICE + 1]
        hi, lo = his[here], los[here]
        same[start:start + len(here) - 1] = (hi[1:] == hi[:-1]) & (lo[1:] == lo[:-1])
    if not same.any():
        return 0, {}
    starts = np.concatenate(([True], ~same))
    group_first = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
    later = np.flatnonzero(same) + 1
    repeats, firsts = order[later], group_first[later]
    shown = np.argsort(repeats)[:max_listed]
    found = {int(repeats[k]): int(firsts[k]) for k in shown}
    names = _ids_at(encoded, set(found))
    return len(later), {i: f"duplicate id {names[i]} (first at index {first})" for i, first in found.items()}


def _ids_at(encoded: memoryview, wanted: set[int]) -> dict[int, str]:
    """The ids (as JSON) of the records at `wanted` indexes: a second pass, on the error path only."""
    names: dict[int, str] = {}
    for index, record in enumerate(ijson.items(BufferReader(encoded), "item", use_float=True)):
        if index in wanted:
            names[index] = orjson.dumps(record["id"]).decode()
            if len(names) == len(wanted):
                break
    return names
