"""Reading a task submission without decoding its inline records.

The body is read once into one buffer (bounded by the API's body limit). msgspec then decodes only
its outline: every top-level field but `input.records`, which stays encoded (`msgspec.Raw`, a view
into the buffer) for `inline_records.scan_records` to stream. So the team can be checked before
any record is looked at, and no record ever exists as a Python object beyond its own turn.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
from aiohttp import web

from minions.services.api.http.bodies import MAX_JSON_DEPTH, THREAD_ABOVE, nested_deeper_than, read_within
from minions.services.api.http.errors import ApiError, bad_request

MAX_FIELD_BYTES = 1 << 20  # any field but input.records, encoded
_OUTLINE = msgspec.json.Decoder(dict[str, msgspec.Raw])


@dataclass
class Submission:
    fields: dict[str, Any]  # the body's fields, decoded, with input.records left out
    records: memoryview | None  # input.records, still encoded (None when absent)
    errors: dict[str, str] = field(default_factory=dict)  # fields refused while reading


async def read_submission(request: web.Request, limit: int) -> Submission:
    body = await read_within(request, limit, too_large)
    if not body.strip():
        raise bad_request("request body is empty; a JSON object is required")
    if len(body) > THREAD_ABOVE:
        return await asyncio.to_thread(outline, body)
    return outline(body)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"request body over {limit:,} bytes; upload large inputs with "
                                      "POST /api/v1/inputs and submit their uri")


def outline(body: bytearray) -> Submission:
    try:
        encoded = _OUTLINE.decode(body)
    except msgspec.ValidationError:
        raise bad_request("request body must be a JSON object") from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", "malformed_json") from None
    except RecursionError:
        raise too_deep() from None
    submission = Submission({}, None)
    for key, raw in encoded.items():
        if key == "input":
            submission.fields[key] = _input(raw, submission)
        else:
            submission.fields[key] = _field(key, raw, submission.errors)
    return submission


def too_deep() -> ApiError:
    return bad_request(f"JSON nested more than {MAX_JSON_DEPTH} levels deep", "too_deep")


def _input(raw: msgspec.Raw, submission: Submission) -> Any:
    view = memoryview(raw)
    if bytes(view[:1]) != b"{":
        return None  # not an object: validation says what it must be, without decoding it
    encoded = _OUTLINE.decode(view)
    value: dict[str, Any] = {}
    for key, item in encoded.items():
        if key == "records":
            submission.records = memoryview(item)
            value[key] = []  # a placeholder: the records are streamed, not decoded here
        else:
            value[key] = _field(f"input.{key}", item, submission.errors)
    return value


def _field(name: str, raw: msgspec.Raw, errors: dict[str, str]) -> Any:
    view = memoryview(raw)
    if len(view) > MAX_FIELD_BYTES:
        errors[name] = f"too large: at most {MAX_FIELD_BYTES:,} bytes of JSON"
        return None
    try:
        value = orjson.loads(view)
    except orjson.JSONDecodeError as exc:  # msgspec took it, orjson does not (e.g. an int over 64 bits)
        errors[name] = f"cannot be read: {exc}"
        return None
    if nested_deeper_than(value, MAX_JSON_DEPTH):
        errors[name] = f"nested more than {MAX_JSON_DEPTH} levels deep"
        return None
    return value
