"""OutputCheck, the pure part of complete's output verification: chunk boundaries anywhere, in either
object, in any interleaving, give the same verdict."""

from __future__ import annotations

import hashlib
import re

import pytest

from minions import jsoncodec, result_shapes
from minions.services.api.leasing.output_check import OutputCheck, OutputMismatch

INPUT = b'{"id": "a", "ms": 1}\n\n{"id": 7, "ms": 1}\r\n{"id": "c", "ms": 1}'  # blank line, CRLF, no final \n
GOOD = b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": 1}) for i in ("a", 7, "c"))


def _verdict(output: bytes, size: int, records: int = 3) -> str | None:
    check = OutputCheck(records, "sleep")
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
    check = OutputCheck(3, "sleep")
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
    check = OutputCheck(3, "sleep")
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


# -- shapes per kind (minions/result_shapes.py) ---------------------------------------------------

IDS = ["a", 7, "c"]
EMB = [{"id": i, "embedding": [0.5, -1, 2.0], "usage": {"prompt_tokens": 3}} for i in IDS]
DONE = [{"id": i, "text": "Answer: 42", "usage": {"prompt_tokens": 5, "completion_tokens": 2}} for i in IDS]


def _lines(records: list[dict[str, object]], raw: dict[int, bytes] | None = None) -> bytes:
    """JSONL of `records`, line n (0-based) replaced by raw[n] where given."""
    return b"".join((raw or {}).get(n, jsoncodec.dumps_line(r)) for n, r in enumerate(records))


def _shape_verdict(kind: str, output: bytes, size: int) -> tuple[str | None, OutputCheck]:
    check = OutputCheck(3, kind)
    check.add_input(INPUT)
    check.input_done()
    try:
        for start in range(0, len(output), size):
            check.add_output(output[start:start + size])
        check.finish()
    except OutputMismatch as exc:
        return str(exc), check
    return None, check


def _with(records: list[dict[str, object]], n: int, **fields: object) -> list[dict[str, object]]:
    changed = [dict(r) for r in records]
    changed[n].update(fields)
    return changed


def _without(records: list[dict[str, object]], n: int, field: str) -> list[dict[str, object]]:
    changed = [dict(r) for r in records]
    del changed[n][field]
    return changed


@pytest.mark.parametrize("size", [1, 9, 100000])
@pytest.mark.parametrize(("kind", "output"), [
    ("embedding", _lines(EMB)),
    ("embedding", _lines([{"id": i, "embedding": [1e-30, -3.4028234663852886e38, 7]} for i in IDS])),  # float32's edge
    ("embedding", _lines(_without(EMB, 1, "usage"))),
    ("embedding", _lines([{"id": "a", "embedding": [1.0]}, {"id": 7, "error": "model crashed"},
                          {"id": "c", "embedding": [2.0], "extra": {"k:v": ["x:y", {"n": 1}]}}])),
    ("completion", _lines(DONE)),
    ("completion", _lines(_with(_without(DONE, 0, "usage"), 2, text=""))),
    ("completion", _lines([{"id": "a", "text": "x"}, {"id": 7, "error": "too long"}, {"id": "c", "text": "y"}])),
    ("sleep", _lines([{"id": i, "slept_ms": "whatever", "embedding": "not checked"} for i in IDS])),
], ids=["embedding", "float32-edge", "no-usage", "error-line", "completion", "empty-text", "completion-error",
        "sleep-unchecked"])
def test_an_output_of_its_kind_s_shape_passes(kind: str, output: bytes, size: int) -> None:
    verdict, check = _shape_verdict(kind, output, size)
    assert verdict is None
    assert check.dimension == (None if kind != "embedding" else 3 if b"[1.0]" not in output else 1)


BAD_SHAPES = [
    # (kind, output, what the message says)
    ("embedding", _lines(_without(EMB, 1, "embedding")), "output line 2: `embedding` missing"),
    ("embedding", _lines(_with(EMB, 1, embedding=[])), "output line 2: `embedding` must be a non-empty list"),
    ("embedding", _lines(_with(EMB, 0, embedding="0.5,1")), "output line 1: `embedding` must be a non-empty list"),
    ("embedding", _lines(_with(EMB, 2, embedding=None)), "output line 3: `embedding` must be a non-empty list"),
    ("embedding", _lines(_with(EMB, 1, embedding=[0.5, "1", 2.0])), "output line 2: `embedding[1]` must be a number, "
                                                                    "not a string"),
    ("embedding", _lines(_with(EMB, 1, embedding=[0.5, True, 2.0])), "`embedding[1]` must be a number, not a boolean"),
    ("embedding", _lines(_with(EMB, 1, embedding=[0.5, [1.0], 2.0])), "`embedding[1]` must be a number, not a list"),
    ("embedding", _lines(_with(EMB, 1, embedding=[0.5, None, 2.0])), "`embedding[1]` must be a number, not null"),
    ("embedding", _lines(_with(EMB, 1, embedding=[0.5, 1e308, 2.0])), "`embedding[1]` is 1e+308: not a finite float32"),
    ("embedding", _lines(_with(EMB, 1, embedding=[0.5, -3.5e38, 2.0])), "`embedding[1]` is -3.5e+38"),
    ("embedding", _lines(_with(EMB, 2, embedding=[0.5, 1.0])), "output line 3: `embedding` has 2 dimensions; the "
                                                               "task's results have 3"),
    ("embedding", _lines(_with(EMB, 0, usage={"prompt_tokens": -1})), "output line 1: `usage.prompt_tokens` must be "
                                                                      "a non-negative integer"),
    ("embedding", _lines(_with(EMB, 0, usage="3 tokens")), "`usage` must be an object of token counts"),
    ("embedding", _lines(_with(EMB, 1, error="")), "output line 2: `error` must be a non-empty string"),
    ("embedding", _lines(_with(EMB, 1, error=None)), "`error` must be a non-empty string"),
    ("embedding", _lines(_with(EMB, 1, error="oom")), "output line 2: `embedding` beside an `error`"),
    ("completion", _lines(_without(DONE, 2, "text")), "output line 3: `text` missing"),
    ("completion", _lines(_with(DONE, 0, text=["a", "b"])), "output line 1: `text` must be a string, not a list"),
    ("completion", _lines(_with(DONE, 0, text=None)), "`text` must be a string, not null"),
    ("completion", _lines(_with(DONE, 1, usage={"prompt_tokens": 1.5})), "`usage.prompt_tokens` must be a "
                                                                        "non-negative integer, not a number"),
    ("completion", _lines(_with(DONE, 1, usage={"completion_tokens": True})), "`usage.completion_tokens` must be"),
    ("completion", _lines(_with(DONE, 1, usage=[1, 2])), "`usage` must be an object of token counts, not a list"),
]


@pytest.mark.parametrize("size", [1, 9, 100000])
@pytest.mark.parametrize(("kind", "output", "says"), BAD_SHAPES, ids=[f"{k}-{i}" for i, (k, _, _) in
                                                                      enumerate(BAD_SHAPES)])
def test_an_output_that_breaks_its_kind_s_shape_is_refused_naming_line_and_field(
        kind: str, output: bytes, says: str, size: int) -> None:
    verdict, _ = _shape_verdict(kind, output, size)
    assert verdict is not None and says in verdict, verdict


REPEATS = [
    # A key twice: the parser would keep one value, the check and a reader could see different records.
    (b'{"id": 9, "id": "a", "slept_ms": 1}\n', '"id"'),
    (b'{"id": "a", "slept_ms": 1, "slept_ms": 2}\n', '"slept_ms"'),
    (b'{"id": "a", "x": {"k": 1, "k": 2}}\n', '"k"'),  # in a nested object
    (b'{"id": "a", "x": [{"k": 1}, {"k": 2, "j": 1, "j": 3}]}\n', '"j"'),  # in an object in a list
    (b'{"id": "a", "t": "a:b:c", "\\u0074": "x"}\n', '"t"'),  # spelled with an escape
    (b'{"id": "a", "t": "\\u003a\\u003a", "t": "x"}\n', '"t"'),  # colons spelled as escapes
]


@pytest.mark.parametrize(("line", "key"), REPEATS)
def test_a_line_that_repeats_a_key_is_refused(line: bytes, key: str) -> None:
    check = OutputCheck(1, "sleep")
    check.add_input(b'{"id": "a"}\n')
    check.input_done()
    with pytest.raises(OutputMismatch, match=f"output line 1 repeats the key {key}"):
        check.add_output(line)


@pytest.mark.parametrize("kind", ["embedding", "completion"])
def test_a_result_line_that_repeats_a_key_is_refused(kind: str) -> None:
    records = EMB if kind == "embedding" else DONE
    field = result_shapes.RESULT_FIELD[kind]
    # The usual line's colons all accounted for, but one key twice: {"id", <result>, "usage": {...}, "id"}.
    line = jsoncodec.dumps_line(records[1])[:-2] + b',"id":7}\n'
    verdict, _ = _shape_verdict(kind, _lines(records, {1: line}), 100000)
    assert verdict is not None and 'output line 2 repeats the key "id"' in verdict
    usage_twice = jsoncodec.dumps_line(records[2]).replace(b'"usage":{', b'"usage":{"prompt_tokens":1,')
    verdict, _ = _shape_verdict(kind, _lines(records, {2: usage_twice}), 100000)
    assert verdict is not None and 'output line 3 repeats the key "prompt_tokens"' in verdict, (verdict, field)


@pytest.mark.parametrize("line", [
    b'{"id": "a", "t": "a:b", "u": {"k": "x:y"}}\n',   # colons in strings, not pairs
    b'{"id": "a", "t": "\\u003a", "k": 1}\n',          # a colon spelled as an escape
    b'{"id": "a:b", "x": [{"k": 1}, {"k": 2}]}\n',      # the same key in two objects
    b'{"id": "a", "\\u0074": 1, "u": 2}\n',
])
def test_a_line_without_a_repeated_key_passes(line: bytes) -> None:
    check = OutputCheck(1, "sleep")
    check.add_input(line.replace(b'"a:b"', b'"a:b"'))
    check.input_done()
    check.add_output(line)
    check.finish()


def test_the_dimension_is_the_first_vector_s_and_holds_across_chunks() -> None:
    """An output's vectors are checked against the first one's length whatever the chunking, and the
    check reports it (complete pins it for the task), with the line it came from."""
    records = [{"id": "a", "error": "failed"}, {"id": 7, "embedding": [1.0, 2.0]}, {"id": "c", "embedding": [3.0, 4.0]}]
    for size in (1, 5, 1000):
        verdict, check = _shape_verdict("embedding", _lines(records), size)
        assert verdict is None and (check.dimension, check.dimension_line) == (2, 2)
    records[2]["embedding"] = [3.0]
    verdict, _ = _shape_verdict("embedding", _lines(records), 1000)
    assert verdict is not None and "output line 3: `embedding` has 1 dimensions; the task's results have 2" in verdict


def test_readers_get_the_same_verdict_from_read_record() -> None:
    assert result_shapes.read_record("embedding", b'{"id": 1, "embedding": [1, 2]}', 2)["embedding"] == [1, 2]
    for line, says in [(b'{"id": 1, "embedding": ["1"]}', "`embedding[0]` must be a number"),
                       (b'{"id": 1, "embedding": [1]}', "`embedding` has 1 dimensions; the task's results have 2"),
                       (b'{"id": 1}', "`embedding` missing"),
                       (b"not json", "`line` is not JSON"),
                       (b"[1, 2]", "`line` is not a JSON object with an id")]:
        with pytest.raises(result_shapes.Malformed, match=re.escape(says)):
            result_shapes.read_record("embedding", line, 2)
