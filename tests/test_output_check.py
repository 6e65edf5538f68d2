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


LEASE = "0ee2a6a5-3636-492e-b2ff-01b1f0f84b7f"
LEAKY = b"".join([
    jsoncodec.dumps_line({"id": "a", "slept_ms": 1}),
    # The key spelled with a JSON escape is the same key: the parsed record is what is checked.
    b'{"id": 7, "\\u0065rror": "lease ' + LEASE.encode() + b' and mn_abcdefghijklmnop"}\n',
    jsoncodec.dumps_line({"id": "c", "error": {"message": f"PUT /x?sig=abc failed ({LEASE})", "sig": "s"}}),
])


def _committed(output: bytes, size: int) -> tuple[bytes, OutputCheck]:
    check = OutputCheck(3)
    check.add_input(INPUT)
    check.input_done()
    committed = b"".join(check.add_output(output[start:start + size]) for start in range(0, len(output), size))
    check.finish()
    return committed, check


@pytest.mark.parametrize("size", [1, 7, 40, 1000])
def test_an_error_field_is_committed_redacted_and_hashed_as_committed(size: int) -> None:
    committed, check = _committed(LEAKY, size)
    lines = [jsoncodec.loads(line) for line in committed.splitlines()]
    assert lines == [
        {"id": "a", "slept_ms": 1},
        {"id": 7, "error": "lease [redacted] and mn_[redacted]"},
        {"id": "c", "error": {"message": "PUT /x?sig=[redacted] failed ([redacted])", "sig": "[redacted]"}},
    ]
    assert committed.endswith(b"\n") and LEASE.encode() not in committed
    assert check.sha256.digest() == hashlib.sha256(committed).digest() and check.size == len(committed)


@pytest.mark.parametrize("size", [1, 7, 1000])
def test_an_output_without_secrets_is_committed_byte_for_byte(size: int) -> None:
    harmless = GOOD.replace(b'"slept_ms":1}', b'"slept_ms":1,"error":"slow disk"}', 1)
    assert _committed(harmless, size)[0] == harmless
    assert _committed(GOOD, size)[0] == GOOD
