"""What complete checks of an output: one JSONL line per input record, carrying the input's ids in
order (API.md, "Output object"). Pure and synchronous, fed chunks of both objects as they stream in,
so it holds O(one chunk) whatever their size; `services/api/leasing/complete.py` drives it.

Ids are compared with the input's, and each line is held to its kind's shape (minions/result_shapes.py:
an embedding a list of float32 numbers, the same length on every line; a completion's text a string;
token counts non-negative integers; no key twice), so that every reader of results may rely on it.
Every output line must be a JSON object that ends with a newline: results concatenate the outputs of
a task's subtasks, so a line that is not whole, or not JSON, would corrupt its neighbours.

One field is not the runner's alone: a record's `error` is the executor's failure text, shown to the
task's team in results like a fail's `error`, so it gets the same redaction
(minions.redaction.redact_failure: API and bearer tokens, URL signatures, any lease's token). The
check hands back the bytes to commit, whole lines only, with such a line rewritten; the hash and
size it keeps are those of the committed bytes, so a result is verified and served as redacted
(serving could not redact: a compacted task's parts are read straight from the store by URL).
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import msgspec
import orjson

from minions import result_shapes
from minions.records import format_id
from minions.redaction import redact_failure_value
from minions.result_shapes import Malformed

# A single output line longer than this (a completion of ~32 MB) is refused rather than buffered.
MAX_LINE_BYTES = 32 * 1024 * 1024


_USAGES = list[dict[str, result_shapes.Count]]


class OutputMismatch(Exception):
    """The output does not answer the subtask's records; `str()` says where and how."""


class _Lines:
    """Complete lines (without their newline) from chunks of any size; at most one partial line held."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._carry = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        lines = chunk.split(b"\n")
        if len(lines) == 1:
            self._keep(chunk)
            return []
        if self._carry:
            self._keep(lines[0])
            lines[0] = bytes(self._carry)
            self._carry.clear()
        self._keep(lines.pop())
        return lines

    @property
    def holding(self) -> bool:
        """Whether a partial line is held (the next complete line starts with it)."""
        return bool(self._carry)

    def rest(self) -> bytes:
        """The last line when it has no newline (b"" when the input ended with one)."""
        rest = bytes(self._carry)
        self._carry.clear()
        return rest

    def _keep(self, piece: bytes) -> None:
        if len(self._carry) + len(piece) > MAX_LINE_BYTES:
            raise OutputMismatch(f"{self._what} has a line longer than {MAX_LINE_BYTES} bytes")
        self._carry += piece


def _shown(record_id: object) -> str:
    text = format_id(record_id)
    return text if len(text) <= 80 else text[:77] + "..."


def _redact_error(record: dict[str, object]) -> bool:
    """Redact `record`'s `error` in place; whether that changed it."""
    redacted = redact_failure_value(record["error"])
    if redacted == record["error"]:
        return False
    record["error"] = redacted
    return True


def _same_id(a: object, b: object) -> bool:
    # The string "7" and the integer 7 are different ids (as in records.DuplicateIds).
    return type(a) is type(b) and a == b


class OutputCheck:
    """Feed it the subtask's input range (`add_input`) and its output (`add_output`) in any
    interleaving; each call matches as many lines as both sides allow and raises OutputMismatch at the
    first wrong one. `add_output` returns the bytes to commit (see the module's doc); the check hashes
    them (SHA-256) and counts them: what complete records. `dimension`: the length of the output's
    vectors (an embedding output with at least one), which complete pins for the whole task."""

    def __init__(self, records: int, kind: str) -> None:
        self.records = records
        self.kind = kind
        self.dimension: int | None = None
        self.dimension_line = 0  # the output line whose vector fixed `dimension`
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._input = _Lines("the input")
        self._output = _Lines("the output")
        self._expected: list[object] = []  # ids of input records not yet matched
        self._got: list[object] = []  # ids of output lines not yet matched
        self._output_lines = 0  # output lines read so far
        self._matched = 0

    @property
    def wants_input(self) -> bool:
        """Whether output lines are waiting for input records to be compared with."""
        return bool(self._got)

    def add_output(self, chunk: bytes) -> bytes:
        """Check the output's next `chunk`; returns the bytes to commit for it: its complete lines (a
        line begun in an earlier chunk included, one it leaves unfinished held back), the chunk
        itself when that is what they are."""
        held = self._output.holding
        lines = self._output.feed(chunk)
        try:
            # The fast path, per chunk: comprehensions, no call per line of ours.
            if self._output_lines + len(lines) > self.records:
                raise ValueError
            values = [orjson.loads(line) for line in lines]
            ids = [value["id"] for value in values]
        except (ValueError, TypeError, KeyError):  # JSONDecodeError is a ValueError
            ids = [self._output_id(n, line) for n, line in enumerate(lines, self._output_lines + 1)]
            raise AssertionError("unreachable: the slow path raises at the faulty line") from None
        if not self._shapes_hold(lines, values):
            for n, (line, value) in enumerate(zip(lines, values, strict=True), self._output_lines + 1):
                self._check_line(n, line, value)
        self._output_lines += len(lines)
        self._got.extend(ids)
        self._match()
        rewritten = [n for n, value in enumerate(values) if "error" in value and _redact_error(value)]
        if not held and not rewritten and chunk.endswith(b"\n"):
            committed = chunk
        else:
            for n in rewritten:
                lines[n] = orjson.dumps(values[n])
            committed = b"\n".join(lines) + b"\n" if lines else b""
        self.sha256.update(committed)
        self.size += len(committed)
        return committed

    def add_input(self, chunk: bytes) -> None:
        # The splitter validated every record of the input: each line is an object with an id;
        # blank lines are not records (the splitter skips them too).
        self._expected.extend(orjson.loads(line)["id"] for line in self._input.feed(chunk) if line.strip())
        self._match()

    def input_done(self) -> None:
        """The input range is read to its end: its last record may lack a newline."""
        last = self._input.rest()
        if last.strip():
            self._expected.append(orjson.loads(last)["id"])
        self._match()
        if self._got:
            raise OutputMismatch(f"the output has more lines than the subtask's {self.records} records")

    def finish(self) -> None:
        """The output is read to its end (call after matching has consumed every output line)."""
        if self._output.rest():
            raise OutputMismatch(f"output line {self._output_lines + 1} does not end with a newline")
        if self._got or self._matched != self.records:
            raise OutputMismatch(f"the output has {self._output_lines} lines; the subtask has "
                                 f"{self.records} records (one line per record, in input order)")

    def _output_id(self, number: int, line: bytes) -> object:
        """The id of output line `number`, or OutputMismatch saying what is wrong with it."""
        if number > self.records:
            raise OutputMismatch(f"the output has more lines than the subtask's {self.records} records")
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise OutputMismatch(f"output line {number} is not JSON: {exc.msg}") from None
        if not isinstance(value, dict) or "id" not in value:
            raise OutputMismatch(f"output line {number} is not a JSON object with an id")
        return value["id"]

    def _shapes_hold(self, lines: list[bytes], values: list[Any]) -> bool:
        """Whether every line has its kind's shape and no repeated key, checked a chunk at a time
        (msgspec validates a chunk's vectors in one call); False when a line needs a closer look,
        which `_check_line` gives it, naming the first fault."""
        field = result_shapes.RESULT_FIELD.get(self.kind)
        if field is None:  # sleep: no shape; no key twice
            return self._no_repeats(lines, values, list(map(len, values)))
        try:
            if any("error" in value for value in values):
                return False  # a record's failure: rare, checked a line at a time
            results = [value[field] for value in values]
            usages = [value["usage"] for value in values if "usage" in value]
            if usages:
                msgspec.convert(usages, _USAGES)
            if field == "text":
                if not all(type(text) is str for text in results):
                    return False
            else:
                msgspec.convert(results, result_shapes.Vectors)
                dimensions = set(map(len, results))
                if len(dimensions) > 1 or (self.dimension is not None and dimensions != {self.dimension}):
                    return False
                if self.dimension is None and dimensions:
                    self.dimension, self.dimension_line = dimensions.pop(), self._output_lines + 1
        except (KeyError, msgspec.ValidationError):
            return False
        # The pairs known: the line's own and its usage's (see result_shapes.repeated_key).
        known = [len(value) + len(value["usage"]) if "usage" in value else len(value) for value in values]
        return self._no_repeats(lines, values, known, field)

    @staticmethod
    def _no_repeats(lines: list[bytes], values: list[Any], known: list[int], field: str | None = None) -> bool:
        """Whether no line repeats a key: at once for a line with no more colons than `known` pairs
        (every line, usually), else by result_shapes.repeated_key, told the colons of a completion's
        text."""
        counts = list(map(bytes.count, lines, itertools.repeat(b":")))
        if counts == known:  # never fewer: each pair has its colon
            return True
        for n, (count, pairs) in enumerate(zip(counts, known, strict=True)):
            if count > pairs:
                text = values[n].get(field) if field == "text" else None
                in_text = text.count(":") if isinstance(text, str) else 0
                if result_shapes.repeated_key(lines[n], values[n], pairs, in_text) is not None:
                    return False
        return True

    def _check_line(self, number: int, line: bytes, value: Any) -> None:
        """OutputMismatch naming the line and the field if line `number` breaks its kind's shape or
        repeats a key; the first vector fixes the output's dimension."""
        try:
            length = result_shapes.check_record(self.kind, value, self.dimension)
        except Malformed as exc:
            raise OutputMismatch(f"output line {number}: {exc}") from None
        if length is not None and self.dimension is None:
            self.dimension, self.dimension_line = length, number
        repeated = result_shapes.repeated_key(line, value, len(value))
        if repeated is not None:
            raise OutputMismatch(f"output line {number} repeats the key {orjson.dumps(repeated).decode()} "
                                 "(a line holds each key once)")

    def _match(self) -> None:
        count = min(len(self._got), len(self._expected))
        if not count:
            return
        got, want = self._got[:count], self._expected[:count]
        # Equal values of another JSON type (1 and 1.0, 1 and true) are different ids.
        if got != want or list(map(type, got)) != list(map(type, want)):
            for n, (a, b) in enumerate(zip(got, want, strict=True), self._matched + 1):
                if not _same_id(a, b):
                    raise OutputMismatch(f"output line {n} has id {_shown(a)}; record {n} of the subtask "
                                         f"has id {_shown(b)}")
        del self._got[:count], self._expected[:count]
        self._matched += count
