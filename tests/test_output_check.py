"""OutputCheck, the pure part of complete's output verification: chunk boundaries anywhere, in either
object, in any interleaving, give the same verdict."""

from __future__ import annotations

import hashlib

import pytest

from minions import jsoncodec
from minions.services.api.output_check import OutputCheck, OutputMismatch

INPUT = b'{"id": "a", "ms": 1}\n\n{"id": 7, "ms": 1}\r\n{"id": "c", "ms": 1}'  # blank line, CRLF, no final \n
GOOD = b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": 1}) for i in ("a", 7, "c"))


def _verdict(output: bytes, size: int, records: int = 3) -> str | None:
    check = OutputCheck(records)
    pieces = [INPUT[i:i + size] for i in range(0, len(INPUT), size)]
    try:
        for start in range(0, len(output), size):
            check.add_output(output[start:start + size])
            while check.wants_input and pieces:
                check.add_input(pieces.pop(0))
            if check.wants_input and not pieces:
                check.input_done()
        check.finish()
    except OutputMismatch as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("size", [1, 2, 5, 17, 1000])
def test_a_conforming_output_passes_at_any_chunking(size: int) -> None:
    assert _verdict(GOOD, size) is None


@pytest.mark.parametrize(("output", "says"), [
    (b"", "0 lines"),
    (GOOD[:GOOD.index(b"\n") + 1], "1 lines"),
    (GOOD + GOOD[:GOOD.index(b"\n") + 1], "more lines"),
    (GOOD.replace(b'"id":7', b'"id":"7"'), 'has id "7"; record 2 of the subtask has id 7'),
    (GOOD.rstrip(b"\n"), "does not end with a newline"),
    (b"[1]\n" + GOOD, "not a JSON object with an id"),
    (b"{\n" + GOOD, "not JSON"),
])
@pytest.mark.parametrize("size", [1, 3, 1000])
def test_a_wrong_output_is_refused_saying_why(output: bytes, says: str, size: int) -> None:
    verdict = _verdict(output, size)
    assert verdict is not None and says in verdict, verdict


def test_it_hashes_and_counts_what_it_checked() -> None:
    check = OutputCheck(3)
    check.add_input(INPUT)
    check.input_done()
    check.add_output(GOOD)
    check.finish()
    assert check.sha256.digest() == hashlib.sha256(GOOD).digest() and check.size == len(GOOD)
