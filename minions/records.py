"""Input records: the shape each task kind accepts (API.md), checked in one place.

The API validates inline records with these functions (a 422 names the field), and the splitter
validates every line of an uploaded input with the same ones, so a record is either good
everywhere or nowhere.

    embedding   {"id", "text": str}
    completion  {"id", "prompt": str}  or  {"id", "messages": [{"role", "content": str}, ...]}
    sleep       {"id", "ms": number in 0..3_600_000}

`id` is a non-empty string of at most 256 characters, or an integer (64 bits). Other fields are
allowed and ignored, so producers can carry their own metadata through the input file.

The shapes are msgspec Structs (msgspec is the protocol's library): a JSONL line is parsed and
checked in one pass, a syntax error says its column, and msgspec's messages are put in the words
a reason has here ("text: must be a string").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Annotated, Final, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, Struct, UnsetType

from minions.kinds import KINDS

CHAT_ROLES: Final = ("system", "user", "assistant", "tool")
MAX_ID_LENGTH: Final = 256
MAX_SLEEP_MS: Final = 3_600_000

_ID_RULE = "must be a non-empty string or an integer"

# The shapes, as msgspec Structs: decoding a line against its kind's Struct checks it in the same
# pass that parses it (and says where the JSON broke, by byte). Unknown fields are ignored.
# An integer id must fit a signed 64-bit integer: the ids are encoded again (orjson) for results and digests.
RecordId = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LENGTH)] | Annotated[
    int, Meta(ge=-(2**63), le=2**63 - 1)]


class EmbeddingRecord(Struct):
    id: RecordId
    text: str


class ChatMessage(Struct):
    role: Literal["system", "user", "assistant", "tool"]
    content: str


class CompletionRecord(Struct):
    id: RecordId
    # Exactly one of the two: checked after decoding (`_completion_problem`).
    prompt: str | UnsetType = UNSET
    messages: Annotated[list[ChatMessage], Meta(min_length=1)] | UnsetType = UNSET


class SleepRecord(Struct):
    id: RecordId
    ms: Annotated[float, Meta(ge=0, le=MAX_SLEEP_MS)]


Record = EmbeddingRecord | CompletionRecord | SleepRecord
RECORD_TYPES: Final[dict[str, type[Record]]] = {
    "embedding": EmbeddingRecord, "completion": CompletionRecord, "sleep": SleepRecord}
_DECODERS: Final = {kind: msgspec.json.Decoder(shape) for kind, shape in RECORD_TYPES.items()}
assert tuple(RECORD_TYPES) == KINDS


def find_problem(kind: str, record: object) -> tuple[str, str] | None:
    """The first problem of `record` for `kind` as (field, reason), or None when it is valid.

    `field` is a path inside the record ("text", "messages[2].role", or "" for the record as a
    whole), so the API can report `{"fields": {"input.records[7].text": "must be a string"}}`.
    """
    if kind not in KINDS:
        return "kind", f"unknown kind {kind!r} (one of {', '.join(KINDS)})"
    try:
        checked = msgspec.convert(record, RECORD_TYPES[kind])
    except msgspec.ValidationError as exc:
        return _field_problem(str(exc))
    return _completion_problem(checked)


def check_record(kind: str, record: object) -> str | None:
    """None if `record` is valid for `kind`, else a short reason naming the field
    ("text: must be a string")."""
    problem = find_problem(kind, record)
    if problem is None:
        return None
    return _joined(problem)


def parse_line(kind: str, line: bytes) -> tuple[object, str | None]:
    """Decode one JSONL line and check it: (the record's id, None), or (None, the reason).

    The caller skips blank lines first; a blank line here is reported as invalid JSON."""
    try:
        record = _DECODERS[kind].decode(line)
    except msgspec.ValidationError as exc:
        return None, _joined(_field_problem(str(exc)))
    except msgspec.DecodeError as exc:
        return None, f"invalid JSON: {_syntax_problem(line, str(exc))}"
    problem = _completion_problem(record)
    if problem is not None:
        return None, _joined(problem)
    return record.id, None


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


class RecordProblem(ValueError):
    """The first line of a JSONL input the splitter would reject (or no record at all), named."""


def check_lines(lines: Iterable[bytes], kind: str, where: str) -> int:
    """The records in `lines` (blank lines skipped), each checked as the splitter will, ids unique;
    RecordProblem naming `where` and the line of the first that is not. One streaming pass."""
    ids = DuplicateIds()
    records = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record_id, problem = parse_line(kind, line)
        if problem is not None:
            raise RecordProblem(f"{where} line {number}: {problem}")
        if ids.seen(record_id):
            raise RecordProblem(f"{where} line {number}: duplicate id {format_id(record_id)}")
        records += 1
    if records == 0:
        raise RecordProblem(f"{where}: no records (one JSON object per line)")
    return records


def _joined(problem: tuple[str, str]) -> str:
    field, reason = problem
    return f"{field}: {reason}" if field else reason


# msgspec's messages: "<what> - at `$.messages[1].role`" (no " - at" for the record itself).
_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_BYTE = re.compile(r"^JSON is malformed: (?P<what>.*) \(byte (?P<byte>\d+)\)$")
_ITEM = re.compile(r"^messages\[\d+\]$")


def _field_problem(error: str) -> tuple[str, str]:
    """msgspec's validation error as (field path, reason) in the words the API has always used."""
    at = _AT.match(error)
    assert at is not None  # the pattern matches any text
    message, path = at["message"], at["path"] or ""
    missing = _MISSING.match(message)
    if missing:
        return (f"{path}.{missing['name']}" if path else missing["name"]), "is required"
    leaf = path.rsplit(".", 1)[-1]
    if not path:
        return "", "record must be a JSON object"
    if leaf == "id":
        if "length <=" in message:
            return path, f"must be at most {MAX_ID_LENGTH} characters"
        if message.startswith("Expected `int` "):
            return path, "must be an integer of at most 64 bits"
        return path, _ID_RULE
    if leaf == "role":
        return path, f"must be one of {', '.join(CHAT_ROLES)}"
    if leaf == "messages":
        if "length >=" in message:
            return path, "must not be empty"
        return path, "must be a list of {role, content} objects"
    if _ITEM.match(leaf):
        return path, "must be an object with role and content"
    if leaf == "ms":
        if message.startswith("Expected `float` "):
            return path, f"must be between 0 and {MAX_SLEEP_MS}"
        return path, "must be a number"
    if leaf in ("text", "prompt", "content"):
        return path, "must be a string"
    return path, message  # a shape added without words of its own: msgspec's


def _syntax_problem(line: bytes, error: str) -> str:
    """Where and how the JSON of one line broke, with the column a reader counts (characters from 1)."""
    at = _BYTE.match(error)
    if at is not None:
        offset = int(at["byte"])
        if at["what"] == "trailing characters":
            offset -= 1  # msgspec (0.23) counts this one from just after the first extra character
        return f"{at['what']} at column {_column(line, offset)}"
    if error == "Input data was truncated":
        # The line ended inside the record: a missing `}`, `]` or closing quote, after its last character.
        end = len(line.rstrip())
        return f"the line ends before the record does (a missing }}, ] or quote?) at column {_column(line, end)}"
    return error[:1].lower() + error[1:]


def _column(line: bytes, offset: int) -> int:
    return len(line[:offset].decode("utf-8", errors="replace")) + 1


def _completion_problem(record: Record) -> tuple[str, str] | None:
    if not isinstance(record, CompletionRecord):
        return None
    has_prompt, has_messages = record.prompt is not UNSET, record.messages is not UNSET
    if has_prompt and has_messages:
        # Which one the executor should use would be a guess; the producer has to choose.
        return "prompt", "give either prompt or messages, not both"
    if not has_prompt and not has_messages:
        return "prompt", "is required (or messages)"
    return None
