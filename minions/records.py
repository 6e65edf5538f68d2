"""Input records: the shape each task kind accepts (API.md), checked in one place.

The API validates inline records with these functions (a 422 names the field), and the splitter
validates every line of an uploaded input with the same ones, so a record is either good
everywhere or nowhere.

    embedding   {"id", "text": str}
    completion  {"id", "prompt": str}  or  {"id", "messages": [{"role", "content": str}, ...]}
    sleep       {"id", "ms": number in 0..3_600_000}

`id` is a non-empty string of at most 256 characters, or an integer. Other fields are allowed and
ignored, so producers can carry their own metadata through the input file.
"""

from __future__ import annotations

import hashlib
from typing import Final

import orjson

from minions.kinds import KINDS

CHAT_ROLES: Final = ("system", "user", "assistant", "tool")
MAX_ID_LENGTH: Final = 256
MAX_SLEEP_MS: Final = 3_600_000

_ID_RULE = "must be a non-empty string or an integer"


def find_problem(kind: str, record: object) -> tuple[str, str] | None:
    """The first problem of `record` for `kind` as (field, reason), or None when it is valid.

    `field` is a path inside the record ("text", "messages[2].role", or "" for the record as a
    whole), so the API can report `{"fields": {"input.records[7].text": "must be a string"}}`.
    """
    if kind not in KINDS:
        return "kind", f"unknown kind {kind!r} (one of {', '.join(KINDS)})"
    if not isinstance(record, dict):
        return "", "record must be a JSON object"
    if "id" not in record:
        return "id", "is required"
    problem = _id_problem(record["id"])
    if problem is not None:
        return "id", problem
    if kind == "embedding":
        return _string_field(record, "text")
    if kind == "completion":
        return _completion_problem(record)
    return _sleep_problem(record)


def check_record(kind: str, record: object) -> str | None:
    """None if `record` is valid for `kind`, else a short reason naming the field
    ("text: must be a string")."""
    problem = find_problem(kind, record)
    if problem is None:
        return None
    field, reason = problem
    return f"{field}: {reason}" if field else reason


def parse_line(kind: str, line: bytes) -> tuple[object, str | None]:
    """Decode one JSONL line and check it: (the record's id, None), or (None, the reason).

    The caller skips blank lines first; a blank line here is reported as invalid JSON."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        # orjson's own position says "line 1" of this one line; only the column means anything.
        return None, f"invalid JSON: {exc.msg} at column {exc.colno}"
    problem = check_record(kind, record)
    if problem is not None:
        return None, problem
    assert isinstance(record, dict)  # check_record accepted it, so it is an object with an id
    return record["id"], None


def format_id(record_id: object) -> str:
    """An id as it appears in JSON (so "7" and 7 read differently in an error message)."""
    return orjson.dumps(record_id).decode()


class DuplicateIds:
    """Remembers the ids seen so far, to reject a second record with the same id.

    Stores a 128-bit BLAKE2b digest of each id's canonical JSON (so the string "7" and the integer
    7 are different ids), not the id itself: memory does not grow with id length. Cost per id in
    CPython 3.11 (measured): the 128-bit int takes a 48-byte block and its set slot 16 bytes at a
    fill of at most 60%, so about 60-100 bytes per id, ~80 MB per million records. A false
    duplicate needs a 128-bit collision: with 10^9 ids its probability is below 10^-20.
    """

    __slots__ = ("_digests",)

    def __init__(self) -> None:
        self._digests: set[int] = set()

    @staticmethod
    def digest(record_id: object) -> int:
        raw = hashlib.blake2b(orjson.dumps(record_id), digest_size=16).digest()
        return int.from_bytes(raw, "little")

    def seen(self, record_id: object) -> bool:
        """True if `record_id` was seen before; otherwise remember it and return False."""
        digest = self.digest(record_id)
        if digest in self._digests:
            return True
        self._digests.add(digest)
        return False

    def __len__(self) -> int:
        return len(self._digests)


def _id_problem(value: object) -> str | None:
    # bool is an int in Python but `true` is not an id anyone means.
    if isinstance(value, bool):
        return _ID_RULE
    if isinstance(value, int):
        return None
    if isinstance(value, str):
        if not value:
            return _ID_RULE
        if len(value) > MAX_ID_LENGTH:
            return f"must be at most {MAX_ID_LENGTH} characters"
        return None
    return _ID_RULE


def _string_field(record: dict[str, object], name: str) -> tuple[str, str] | None:
    if name not in record:
        return name, "is required"
    if not isinstance(record[name], str):
        return name, "must be a string"
    return None


def _completion_problem(record: dict[str, object]) -> tuple[str, str] | None:
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt and has_messages:
        # Which one the executor should use would be a guess; the producer has to choose.
        return "prompt", "give either prompt or messages, not both"
    if not has_prompt and not has_messages:
        return "prompt", "is required (or messages)"
    if has_prompt:
        return _string_field(record, "prompt")
    messages = record["messages"]
    if not isinstance(messages, list):
        return "messages", "must be a list of {role, content} objects"
    if not messages:
        return "messages", "must not be empty"
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            return where, "must be an object with role and content"
        role = message.get("role")
        if role not in CHAT_ROLES:
            return f"{where}.role", f"must be one of {', '.join(CHAT_ROLES)}"
        if not isinstance(message.get("content"), str):
            return f"{where}.content", "must be a string"
    return None


def _sleep_problem(record: dict[str, object]) -> tuple[str, str] | None:
    if "ms" not in record:
        return "ms", "is required"
    ms = record["ms"]
    if isinstance(ms, bool) or not isinstance(ms, int | float):
        return "ms", "must be a number"
    if not 0 <= ms <= MAX_SLEEP_MS:
        return "ms", f"must be between 0 and {MAX_SLEEP_MS}"
    return None
