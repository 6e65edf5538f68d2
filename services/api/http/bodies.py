"""Reading request bodies and query parameters: malformed input is a 400/422, never a 500."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.services.api.http import json_bounds
from minions.services.api.http.errors import ApiError, bad_request, invalid


async def json_object(request: web.Request, *, optional: bool = False, limit: int | None = None) -> dict[str, Any]:
    """The body as a JSON object; `limit`: a route's own cap on its size, below the API's (a body
    that needs no more is never read, let alone decoded, past it). A body over json_bounds.SCAN_ABOVE
    is scanned before it is decoded: past MAX_VALUES values it is refused (422 too_many_values), so
    no body of any route decodes into more than about 10 MB of objects, whatever its size."""
    raw: bytes | bytearray
    if limit is not None:
        raw = await read_within(request, limit)
    else:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            cap = request.app._client_max_size
            raise ApiError(413, "too_large", f"request body over {cap:,} bytes; upload large inputs with "
                                             "POST /api/v1/inputs and submit their uri") from None
    if not raw.strip():
        if optional:
            return {}
        raise bad_request("request body is empty; a JSON object is required")
    return await decode_object(raw, _too_much)


def _too_much(exc: json_bounds.TooMuchJson) -> ApiError:
    if exc.code == "too_deep":
        return bad_request(exc.message, "too_deep")
    return ApiError(422, exc.code, exc.message)


async def decode_object(raw: bytes | bytearray, refused: Callable[[json_bounds.TooMuchJson], ApiError], *,
                        inputs_at: str | None = None, max_inputs: int = 0) -> dict[str, Any]:
    """`raw` as a JSON object, decoded only once it is within json_bounds (scanned when over
    SCAN_ABOVE; `inputs_at`, `max_inputs`: as json_bounds.scan); a bound passed is `refused(exc)`,
    text that is not a JSON object, or a small one nested too deep, 400. Large bodies (an inline
    output) are scanned and decoded in a thread: the event loop serves claims meanwhile."""
    try:
        if len(raw) > THREAD_ABOVE:
            return await asyncio.to_thread(_decode, raw, inputs_at, max_inputs)
        return _decode(raw, inputs_at, max_inputs)
    except json_bounds.TooMuchJson as exc:
        raise refused(exc) from None


MAX_JSON_DEPTH = json_bounds.MAX_DEPTH
THREAD_ABOVE = 1 << 20  # bodies larger than this are scanned and decoded in a worker thread
# The cap of a body that lists lease tokens (a heartbeat, a batched release): protocol.MAX_TOKENS of
# them is about 40 KB.
TOKEN_LIST_BYTES = 256 * 1024


def _decode(raw: bytes | bytearray, inputs_at: str | None, max_inputs: int) -> dict[str, Any]:
    if len(raw) > json_bounds.SCAN_ABOVE:
        json_bounds.scan(raw, inputs_at=inputs_at, max_inputs=max_inputs)
    try:
        value = jsoncodec.loads(raw)
    except jsoncodec.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", "malformed_json") from None
    if not isinstance(value, dict):
        raise bad_request("request body must be a JSON object")
    if len(raw) <= json_bounds.SCAN_ABOVE and nested_deeper_than(value, MAX_JSON_DEPTH):
        # Deeper values break recursive code downstream (a RecursionError, orjson's 255-level
        # limit on writing jsonb): refused here, for every JSON body at once.
        raise bad_request(f"JSON nested more than {MAX_JSON_DEPTH} levels deep", "too_deep")
    return value


async def read_within(request: web.Request, limit: int, too_large: Callable[[int], ApiError] | None = None
                      ) -> bytearray:
    """The body, refused (413, `too_large(limit)`) on a Content-Length over `limit` before a byte is
    read, or as soon as a chunked body passes it: never more than `limit` bytes (and a chunk) held."""
    error = too_large or _over_route_limit
    if request.content_length is not None and request.content_length > limit:
        raise error(limit)
    body = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise error(limit)
    return body


def _over_route_limit(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"request body over {limit:,} bytes, the limit of this route")


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` has arrays/objects nested more than `limit` levels (iterative: no recursion
    to overflow)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid({name: "must be an integer"}) from None
    if not low <= value <= high:
        raise invalid({name: f"must be between {low} and {high}"})
    return value


def query_float(request: web.Request, name: str, default: float, low: float, high: float) -> float:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise invalid({name: "must be a number"}) from None
    if not low <= value <= high:
        raise invalid({name: f"must be between {low:g} and {high:g}"})
    return value


def path_uuid(request: web.Request, name: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(request.match_info[name])
    except ValueError:
        raise ApiError(404, "not_found", f"{what} not found") from None
