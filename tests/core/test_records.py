"""Record shapes per kind (API.md), shared by the API's inline records and the splitter."""

from __future__ import annotations

import pytest

from minions.kinds import KINDS
from minions.records import (
    MAX_ID_LENGTH,
    DuplicateIds,
    check_record,
    find_problem,
    format_id,
    parse_line,
)


def test_kinds() -> None:
    assert KINDS == ("embedding", "completion", "sleep")


@pytest.mark.parametrize("kind, record", [
    ("embedding", {"id": "a1", "text": "hello"}),
    ("embedding", {"id": 7, "text": ""}),
    ("embedding", {"id": "x" * MAX_ID_LENGTH, "text": "t", "extra": [1, 2]}),
    ("completion", {"id": "c", "prompt": "Say hi"}),
    ("completion", {"id": "c", "messages": [{"role": "user", "content": "hi"}]}),
    ("completion", {"id": "c", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "tool", "content": "{}"}]}),
    ("sleep", {"id": 1, "ms": 0}),
    ("sleep", {"id": 1, "ms": 3_600_000}),
    ("sleep", {"id": 1, "ms": 12.5}),
    ("sleep", {"id": -3, "ms": 100}),
])
def test_valid_records(kind: str, record: object) -> None:
    assert check_record(kind, record) is None


@pytest.mark.parametrize("kind, record, reason", [
    ("embedding", ["id", "text"], "record must be a JSON object"),
    ("embedding", "text", "record must be a JSON object"),
    ("embedding", {"text": "t"}, "id: is required"),
    ("embedding", {"id": "", "text": "t"}, "id: must be a non-empty string or an integer"),
    ("embedding", {"id": 1.5, "text": "t"}, "id: must be a non-empty string or an integer"),
    ("embedding", {"id": True, "text": "t"}, "id: must be a non-empty string or an integer"),
    ("embedding", {"id": None, "text": "t"}, "id: must be a non-empty string or an integer"),
    ("embedding", {"id": ["a"], "text": "t"}, "id: must be a non-empty string or an integer"),
    ("embedding", {"id": "x" * (MAX_ID_LENGTH + 1), "text": "t"}, "id: must be at most 256 characters"),
    ("embedding", {"id": 2**64, "text": "t"}, "id: must be an integer of at most 64 bits"),
    ("embedding", {"id": "a"}, "text: is required"),
    ("embedding", {"id": "a", "text": 3}, "text: must be a string"),
    ("embedding", {"id": "a", "text": None}, "text: must be a string"),
    ("completion", {"id": "a"}, "prompt: is required (or messages)"),
    ("completion", {"id": "a", "prompt": ["x"]}, "prompt: must be a string"),
    ("completion", {"id": "a", "prompt": "p", "messages": [{"role": "user", "content": "c"}]},
     "prompt: give either prompt or messages, not both"),
    ("completion", {"id": "a", "messages": []}, "messages: must not be empty"),
    ("completion", {"id": "a", "messages": "hi"}, "messages: must be a list of {role, content} objects"),
    ("completion", {"id": "a", "messages": ["hi"]}, "messages[0]: must be an object with role and content"),
    ("completion", {"id": "a", "messages": [{"role": "user", "content": "c"},
                                            {"role": "bot", "content": "c"}]},
     "messages[1].role: must be one of system, user, assistant, tool"),
    ("completion", {"id": "a", "messages": [{"content": "c"}]}, "messages[0].role: is required"),
    ("completion", {"id": "a", "messages": [{"role": "user"}]}, "messages[0].content: is required"),
    ("completion", {"id": "a", "messages": [{"role": "user", "content": 1}]},
     "messages[0].content: must be a string"),
    ("sleep", {"id": "a"}, "ms: is required"),
    ("sleep", {"id": "a", "ms": "10"}, "ms: must be a number"),
    ("sleep", {"id": "a", "ms": True}, "ms: must be a number"),
    ("sleep", {"id": "a", "ms": -1}, "ms: must be between 0 and 3600000"),
    ("sleep", {"id": "a", "ms": 3_600_001}, "ms: must be between 0 and 3600000"),
])
def test_invalid_records(kind: str, record: object, reason: str) -> None:
    assert check_record(kind, record) == reason


def test_unknown_kind() -> None:
    assert find_problem("translate", {"id": 1}) == (
        "kind", "unknown kind 'translate' (one of embedding, completion, sleep)")


def test_find_problem_gives_field_paths_for_422() -> None:
    assert find_problem("embedding", {"id": 1, "text": "ok"}) is None
    assert find_problem("embedding", {"id": 1, "text": 2}) == ("text", "must be a string")
    assert find_problem("embedding", 5) == ("", "record must be a JSON object")
    assert find_problem("completion", {"id": 1, "messages": [{"role": "x", "content": ""}]}) == (
        "messages[0].role", "must be one of system, user, assistant, tool")


def test_parse_line() -> None:
    assert parse_line("embedding", b'{"id": "a1", "text": "t"}\n') == ("a1", None)
    assert parse_line("sleep", b'{"id": 5, "ms": 1}\r\n') == (5, None)
    assert parse_line("embedding", b'{"id": "a1", "text": 1}\n') == (None, "text: must be a string")
    record_id, error = parse_line("embedding", b'{"id": "a1", "text": }\n')
    assert record_id is None and error is not None and error.startswith("invalid JSON: ")
    assert error.endswith("at column 22")
    assert parse_line("embedding", b"[1]")[1] == "record must be a JSON object"
    assert parse_line("completion", b'{"id": 1}')[1] == "prompt: is required (or messages)"


@pytest.mark.parametrize(("line", "expected"), [
    # A missing `}` is reported after the record's last character, wherever the line ends.
    (b'{"id": 1, "text": "hello"\n', "invalid JSON: the line ends before the record does (a missing }, ] "
                                     "or quote?) at column 26"),
    (b'{"id": 1, "text": "hello"   \r\n', "at column 26"),
    (b'{"id": 1, "text": "hello"} x\n', "invalid JSON: trailing characters at column 28"),
    (b'{"id": 1 "text": "t"}\n', "at column 10"),
    # Columns count characters, not bytes: the two-byte "\u00e9" is one column.
    ('{"id": "\u00e9", "text": ]}\n'.encode(), "invalid character at column 21"),
])
def test_a_broken_line_names_the_column(line: bytes, expected: str) -> None:
    record_id, error = parse_line("embedding", line)
    assert record_id is None and error is not None
    assert error.endswith(expected) and error.startswith("invalid JSON: "), error


def test_duplicate_ids() -> None:
    ids = DuplicateIds()
    assert not ids.seen("a1")
    assert not ids.seen("a2")
    assert ids.seen("a1")
    # The string "7" and the integer 7 are different ids: they are told apart in results too.
    assert not ids.seen(7)
    assert not ids.seen("7")
    assert ids.seen(7)
    assert len(ids) == 4
    assert DuplicateIds.digest("a1") == DuplicateIds.digest("a1") < 2**128


def test_format_id() -> None:
    assert format_id("a1") == '"a1"'
    assert format_id(7) == "7"
