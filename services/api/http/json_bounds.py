"""How much of a JSON body the API will decode, checked before any of it becomes Python objects.

A decoded JSON value costs far more than its text (`[1, 1, ...]`: about 15 times as list items), so a
body is bounded in values and depth as well as in bytes: ijson's event stream (C backend, constant
memory) counts them, and stops at the first one past a limit; only a body within both is decoded.
A body of at most SCAN_ABOVE bytes is decoded without the scan (whatever it holds, it decodes into a
few MB at most). Every JSON body of the API goes through here (bodies.json_object), and /v1's
requests and batch lines too, which also count an embeddings request's inputs (openai/bounds.py).
"""

from __future__ import annotations

import ijson

from minions.services.api.tasks.inline_records import BufferReader

MAX_DEPTH = 64  # no body of the API needs more; orjson writes at most 255
MAX_VALUES = 100_000  # JSON values (strings, numbers, objects, arrays...) per body: ~10 MB decoded
SCAN_ABOVE = 64 * 1024  # bodies and lines larger than this are scanned before they are decoded
_CLOSE = frozenset({"end_map", "end_array"})


class TooMuchJson(Exception):
    """A body past a bound: `code` (too_deep, too_many_values, too_many_inputs), what it is, and
    where (`param`: body, or the path of the counted array)."""

    def __init__(self, code: str, message: str, param: str) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def scan(raw: bytes | bytearray, *, inputs_at: str | None = None, within: str | None = None,
         max_inputs: int = 0) -> None:
    """TooMuchJson unless `raw` is JSON within MAX_DEPTH levels and MAX_VALUES values and, when
    `inputs_at` is given, at most `max_inputs` items in the array at that key of the object at key
    `within` (None: the top level). Nothing is kept: memory stays constant whatever the body holds.
    Invalid JSON is left to the decoder: it stops where this did, within the bounds above."""
    depth = 0
    values = 0
    inputs = 0
    counting_at = -1  # the depth of the items being counted (-1: none)
    key_at: dict[int, str] = {}  # the last key seen in the object open at each depth
    target_depth = 1 if within is None else 2
    param = f"{within}.{inputs_at}" if within else f"body.{inputs_at}"
    try:
        for event, value in ijson.basic_parse(BufferReader(memoryview(raw)), use_float=True):
            if event == "map_key":
                key_at[depth] = value
                continue
            if event in _CLOSE:
                if depth == counting_at:
                    counting_at = -1
                depth -= 1
                continue
            values += 1
            if values > MAX_VALUES:
                raise TooMuchJson("too_many_values", f"more than {MAX_VALUES:,} JSON values in one request", "body")
            if depth == counting_at:
                inputs += 1
                if inputs > max_inputs:
                    raise TooMuchJson("too_many_inputs", f"at most {max_inputs} inputs per request", param)
            if event in ("start_map", "start_array"):
                depth += 1
                key_at.pop(depth, None)
                if depth > MAX_DEPTH:
                    raise TooMuchJson("too_deep", f"JSON nested more than {MAX_DEPTH} levels deep", "body")
                if (inputs_at is not None and event == "start_array" and depth == target_depth + 1
                        and key_at.get(target_depth) == inputs_at
                        and (within is None or key_at.get(1) == within)):
                    counting_at, inputs = depth, 0
    except ijson.JSONError:
        return
