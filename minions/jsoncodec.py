"""The one JSON codec: orjson, with helpers for the shapes the project writes."""

from __future__ import annotations

from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


def dumps_str(value: Any) -> str:
    return orjson.dumps(value).decode()


def dumps_line(value: Any) -> bytes:
    """One JSONL line, newline included. A numpy float32 array is written as the shortest text
    that round-trips each float32 (half the bytes of the same values as doubles)."""
    return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    return orjson.loads(data)
