"""How much of a /v1 request the API will decode, checked before any of it becomes Python objects.

A decoded JSON value costs far more than its text (`["a", "a", ...]`: about 15 times as list items,
about 70 times once translated into records), so a body is bounded twice: in bytes
(MINIONS_OPENAI_MAX_REQUEST_BYTES: an interactive body, or one line of a batch input file) and in
values. ijson's event stream (C backend, constant memory) counts the values, and the inputs of an
embeddings request, and stops at the first one past a limit; only a request within both is decoded.
A request of at most SCAN_ABOVE bytes is decoded without the scan (whatever it holds, it decodes into
a few MB at most), and its inputs are counted once decoded.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from minions.services.api.http import json_bounds
from minions.services.api.http.bodies import decode_object, read_within
from minions.services.api.http.errors import ApiError, bad_request, invalid
from minions.services.api.openai.translate import LineError

MAX_INPUTS = 2048  # per embeddings request, as OpenAI's
MAX_VALUES = json_bounds.MAX_VALUES
SCAN_ABOVE = json_bounds.SCAN_ABOVE  # bodies and lines larger than this are scanned before they are decoded
SETTING = "MINIONS_OPENAI_MAX_REQUEST_BYTES"


def too_large(limit: int) -> ApiError:
    return ApiError(413, "too_large", f"request body over {limit:,} bytes ({SETTING}); send more inputs as "
                                      "several requests, or as a batch (POST /v1/files, POST /v1/batches)")


async def read_request(request: web.Request, limit: int, endpoint: str) -> dict[str, Any]:
    """The JSON object body of an interactive /v1 request: 413 past `limit` bytes (refused on its
    Content-Length before a byte is read), 400 when it is not JSON or too deep, 422 past MAX_INPUTS
    or MAX_VALUES; decoded only once it is within them."""
    raw = await read_within(request, limit, too_large)
    if not raw.strip():
        raise bad_request("request body is empty; a JSON object is required")
    counted = "input" if endpoint == "/v1/embeddings" else None
    return await decode_object(raw, _refused, inputs_at=counted, max_inputs=MAX_INPUTS)


def _refused(exc: json_bounds.TooMuchJson) -> ApiError:
    if exc.code == "too_deep":
        return bad_request(exc.message, "too_deep")
    return invalid({exc.param.removeprefix("body."): exc.message})


def scan(raw: bytes | bytearray, endpoint: str, inputs_at: str = "input", within: str | None = None) -> None:
    """LineError unless `raw` is within json_bounds' depth and values, with at most MAX_INPUTS items in
    the array `inputs_at` of the object at key `within` (None: the top level) when `endpoint` is
    /v1/embeddings. Nothing is kept: memory stays constant whatever the body holds."""
    counted = inputs_at if endpoint == "/v1/embeddings" else None
    try:
        json_bounds.scan(raw, inputs_at=counted, within=within, max_inputs=MAX_INPUTS)
    except json_bounds.TooMuchJson as exc:
        code = "invalid_request" if exc.code == "too_many_inputs" else exc.code
        raise LineError(code, exc.message, exc.param) from None
