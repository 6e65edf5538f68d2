"""Reading request bodies and query parameters: malformed input is a 400/422, never a 500."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from minions import jsoncodec
from services.api.errors import ApiError, bad_request, invalid


async def json_object(request: web.Request, *, optional: bool = False) -> dict[str, Any]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        limit = request.app._client_max_size
        raise ApiError(413, "too_large", f"request body over {limit:,} bytes; upload large inputs with "
                                         "POST /api/v1/inputs and submit their uri") from None
    if not raw.strip():
        if optional:
            return {}
        raise bad_request("request body is empty; a JSON object is required")
    try:
        value = jsoncodec.loads(raw)
    except jsoncodec.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", "malformed_json") from None
    if not isinstance(value, dict):
        raise bad_request("request body must be a JSON object")
    return value


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
