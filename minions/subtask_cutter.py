"""Cutting a JSONL input into subtasks: pure, fed chunk by chunk, constant memory.

A record is a non-blank line. Each subtask holds `subtask_size` records and the half-open byte
range [start, end) of the input that covers exactly its lines, newlines included. Blank lines stay
inside ranges (the executor skips them too) so that the ranges of a task tile the input with no
gap: a subtask ends where the next record line starts, and the last one ends at the end of the
input. That is why a full subtask is held back until the next record line (or the end) is seen.

Every record is validated for the task's kind and checked for a duplicate id on the way, so an
input is either split whole or rejected with the line that is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import orjson

from minions.records import DuplicateIds, format_id, parse_line

# A single line longer than this fails the split instead of growing the buffer without bound.
MAX_LINE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Subtask:
    byte_start: int
    byte_end: int
    first_record: int  # ordinal (0-based) of its first record in the whole input
    records: int


class InputError(Exception):
    """The input cannot be split; `str()` is the task's error, with the 1-based line if any."""

    def __init__(self, reason: str, line: int | None = None, duplicate_id: object = None) -> None:
        super().__init__(f"line {line}: {reason}" if line is not None else reason)
        self.reason = reason
        self.line = line
        # For a duplicate id: the id, so the caller can look up where it was first seen.
        self.duplicate_id = duplicate_id


class Lines:
    """Reassembles lines (newline included; the last may lack one) from chunks of any size.
    Holds at most one incomplete line between chunks."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.number = 0  # 1-based number of the last line returned
        self.offset = 0  # absolute offset just past the last line returned
        self._carry = bytearray()

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        pos = 0
        if self._carry:
            newline = chunk.find(b"\n")
            if newline < 0:
                self._keep(chunk)
                return
            self._keep(chunk[: newline + 1])
            line = bytes(self._carry)
            self._carry.clear()
            pos = newline + 1
            yield self._counted(line)
        find = chunk.find
        while (newline := find(b"\n", pos)) >= 0:
            line = chunk[pos : newline + 1]
            pos = newline + 1
            if len(line) > self.max_line_bytes:
                self._too_long()
            yield self._counted(line)
        if pos < len(chunk):
            self._keep(chunk[pos:])

    def finish(self) -> Iterator[bytes]:
        if self._carry:
            line = bytes(self._carry)
            self._carry.clear()
            yield self._counted(line)

    def _counted(self, line: bytes) -> bytes:
        self.number += 1
        self.offset += len(line)
        return line

    def _keep(self, data: bytes) -> None:
        self._carry += data
        if len(self._carry) > self.max_line_bytes:
            self._too_long()

    def _too_long(self) -> None:
        raise InputError(f"record longer than {self.max_line_bytes} bytes", self.number + 1)


class Cutter:
    """Feed it the input's bytes in order from offset 0; it returns subtasks as they complete.
    Raises InputError at the first bad line."""

    def __init__(self, kind: str, subtask_size: int, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        if subtask_size < 1:
            raise ValueError("subtask_size must be >= 1")
        self.kind = kind
        self.subtask_size = subtask_size
        self.ids = DuplicateIds()
        self.records = 0  # records seen so far
        self._lines = Lines(max_line_bytes)
        self._start = 0  # the open subtask: where it starts, its first record, its records
        self._first = 0
        self._count = 0

    @property
    def offset(self) -> int:
        """Bytes consumed as complete lines (a trailing partial line is not counted yet)."""
        return self._lines.offset

    @property
    def lines(self) -> int:
        return self._lines.number

    def feed(self, chunk: bytes) -> list[Subtask]:
        out: list[Subtask] = []
        for line in self._lines.feed(chunk):
            self._line(line, out)
        return out

    def finish(self) -> list[Subtask]:
        """The end of the input: the last line (which may lack a newline) and the last subtask."""
        out: list[Subtask] = []
        for line in self._lines.finish():
            self._line(line, out)
        if self._count:
            out.append(Subtask(self._start, self._lines.offset, self._first, self._count))
            self._count = 0
        if self.records == 0:
            raise InputError("input has no records")
        return out

    def _line(self, line: bytes, out: list[Subtask]) -> None:
        if line.isspace():
            return
        number = self._lines.number
        record_id, problem = parse_line(self.kind, line)
        if problem is not None:
            raise InputError(problem, number)
        if self.ids.seen(record_id):
            raise InputError(f"duplicate id {format_id(record_id)}", number, record_id)
        if self._count == self.subtask_size:
            # The held-back full subtask ends where this record starts, blank lines included.
            start = self._lines.offset - len(line)
            out.append(Subtask(self._start, start, self._first, self._count))
            self._start, self._first, self._count = start, self.records, 0
        self.records += 1
        self._count += 1


class IdFinder:
    """Finds the first line whose record has a given id. Used only when a split fails on a
    duplicate: remembering every id's line would cost memory on every split, while a second scan
    costs time only on the failing ones."""

    def __init__(self, record_id: object, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._digest = DuplicateIds.digest(record_id)
        self._lines = Lines(max_line_bytes)
        self.found: int | None = None

    def feed(self, chunk: bytes) -> bool:
        """Whether the line is found (then stop feeding)."""
        return any(self._matches(line) for line in self._lines.feed(chunk))

    def finish(self) -> int | None:
        if self.found is None:
            any(self._matches(line) for line in self._lines.finish())
        return self.found

    def _matches(self, line: bytes) -> bool:
        if line.isspace():
            return False
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return False
        if isinstance(record, dict) and "id" in record and DuplicateIds.digest(record["id"]) == self._digest:
            self.found = self._lines.number
            return True
        return False
