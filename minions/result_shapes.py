"""What a result line holds, per kind (docs/API.md, "Output object"): defined here once.

Complete refuses an output line that breaks these rules (services/api/leasing/output_check.py), so every
reader (results as JSONL or .npy, result parts, the OpenAI finalizer and interactive lane, the SDK)
may rely on them. A result committed before the check existed may still break them: readers call
`check_record` on what they read and answer a clear error naming the record, never a crash.

- embedding: `embedding`, a non-empty list of numbers each within float32's finite range (JSON
  has no NaN or infinity; 1e308 would become one as float32), the same length for every record
  of a task; `usage`, if present, an object of non-negative integers.
- completion: `text`, a string; `usage` as above.
- sleep: anything besides the id.
- A line of an embedding or completion task may carry the executor's per-record failure instead of
  a result: `{"id", "error": "<non-empty text>"}`, with no `embedding` or `text` beside it.
- No object in a line repeats a key (a JSON parser keeps one of the values: the check and a reader
  could see different records).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final

import msgspec
import orjson

# The largest finite float32: readers store vectors as float32 (.npy, OpenAI's base64).
F32_MAX: Final = 3.4028234663852886e38
# The field holding a record's result, for kinds whose results have a shape.
RESULT_FIELD: Final = {"embedding": "embedding", "completion": "text"}

Vector = Annotated[list[Annotated[float, msgspec.Meta(ge=-F32_MAX, le=F32_MAX)]], msgspec.Meta(min_length=1)]
Vectors = list[Vector]
Count = Annotated[int, msgspec.Meta(ge=0)]
_USAGE = dict[str, Count]


class Malformed(Exception):
    """A result line that breaks its kind's shape: `field` names the field, `why` what is wrong."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"`{field}` {why}")
        self.field = field
        self.why = why


def check_record(kind: str, record: Any, dimension: int | None = None) -> int | None:
    """Raise Malformed if `record` (a parsed result line) breaks `kind`'s shape, or its vector's
    length is not `dimension` (when given). Returns the vector's length for an embedding result,
    else None."""
    if not isinstance(record, dict) or "id" not in record:
        raise Malformed("line", "is not a JSON object with an id")
    field = RESULT_FIELD.get(kind)
    if field is None:
        return None
    if "error" in record:
        check_error(record, field)
        return None
    if field not in record:
        raise Malformed(field, "missing: a result line carries its result (or an `error`)")
    length = None
    if kind == "embedding":
        length = check_vector(record["embedding"])
        if dimension is not None and length != dimension:
            raise Malformed("embedding", f"has {length} dimensions; the task's results have {dimension}")
    elif not isinstance(record["text"], str):
        raise Malformed("text", f"must be a string, not {_json_type(record['text'])}")
    if "usage" in record:
        check_usage(record["usage"])
    return length


def read_record(kind: str, line: bytes, dimension: int | None = None) -> dict[str, Any]:
    """A stored result line parsed and held to `kind`'s shape (`check_record`); Malformed if it is
    not (a line committed before complete checked shapes)."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise Malformed("line", f"is not JSON ({exc.msg})") from None
    check_record(kind, record, dimension)
    assert isinstance(record, dict)  # check_record refuses anything else
    return record


def check_error(record: dict[str, Any], field: str) -> None:
    """A line carrying the executor's failure of its record: a non-empty text, and no result."""
    error = record["error"]
    if not isinstance(error, str) or not error.strip():
        raise Malformed("error", "must be a non-empty string: the record's failure")
    if field in record:
        raise Malformed(field, "beside an `error`: a line carries a result or an error, not both")


def check_vector(value: Any) -> int:
    """The length of a valid embedding; Malformed saying which element is not a float32 number."""
    if not isinstance(value, list) or not value:
        raise Malformed("embedding", "must be a non-empty list of numbers, not "
                        + ("an empty list" if isinstance(value, list) else _json_type(value)))
    try:
        msgspec.convert(value, Vector)
    except msgspec.ValidationError:
        for n, x in enumerate(value):
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise Malformed(f"embedding[{n}]", f"must be a number, not {_json_type(x)}") from None
            if not -F32_MAX <= x <= F32_MAX:
                raise Malformed(f"embedding[{n}]", f"is {x!r}: not a finite float32") from None
        raise  # msgspec and this loop disagree: a bug, not the executor's
    return len(value)


def check_usage(value: Any) -> None:
    try:
        msgspec.convert(value, _USAGE)
    except msgspec.ValidationError:
        if not isinstance(value, dict):
            raise Malformed("usage", f"must be an object of token counts, not {_json_type(value)}") from None
        for key, count in value.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise Malformed(f"usage.{key}", f"must be a non-negative integer, not {_json_type(count)}") from None
        raise


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


# -- duplicate keys -------------------------------------------------------------------------------


def repeated_key(line: bytes, value: Any, known_pairs: int, known_colons: int = 0) -> str | None:
    """A key that some object of `line` (parsed: `value`) repeats, else None. `known_pairs`: a count
    of key-value pairs the caller knows `value` holds (at most their true number); `known_colons`:
    colons the caller knows its strings hold (at most their true number).

    Sound without a second parse in the common case: every pair of the line has its own colon
    outside strings, so a line holding no more colons than `known_pairs` repeats no key; nor does one
    whose colons beyond those in its strings are no more (exact unless a string spells a colon as
    the escape \\u003a: then the line is parsed again, keeping every pair)."""
    colons = line.count(b":")
    if colons <= known_pairs:
        return None
    if b"\\u003" not in line:
        if colons - known_colons <= known_pairs:
            return None
        pairs, in_strings = _pairs_and_colons(value)
        if colons - in_strings <= pairs:
            return None
    return _first_repeat(line)


def _pairs_and_colons(value: Any) -> tuple[int, int]:
    """Key-value pairs in `value`'s objects, and colons in its strings (keys included). A stack, not
    recursion: a line may nest as deep as the parser allows."""
    pairs = colons = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            colons += item.count(":")
        elif isinstance(item, dict):
            pairs += len(item)
            colons += sum(key.count(":") for key in item)
            stack.extend(v for v in item.values() if isinstance(v, dict | list | str))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, dict | list | str))
    return pairs, colons


class _Repeated(Exception):
    pass


def _keep_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Repeated(key)
        seen.add(key)
    return dict(pairs)


def _first_repeat(line: bytes) -> str | None:
    try:
        json.loads(line, object_pairs_hook=_keep_pairs)
    except _Repeated as exc:
        return str(exc.args[0])
    except (ValueError, RecursionError):  # read by orjson, not by json (nested deeper than it goes)
        return "(a key the check could not read twice alike)"
    return None
