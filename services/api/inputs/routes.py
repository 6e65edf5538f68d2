"""Inputs over HTTP: `POST /api/v1/inputs`, a JSONL upload for clients without an S3 of their own."""

from __future__ import annotations

from aiohttp import web

from minions.services.api.context import Context
from minions.services.api.http.auth import require
from minions.services.api.http.errors import ApiError
from minions.services.api.http.responses import json_response
from minions.services.api.inputs import rules, uploads

routes = web.RouteTableDef()


@routes.post("/api/v1/inputs")
async def upload_input(request: web.Request) -> web.Response:
    principal = require(request, "user")
    if request.content_type not in ("application/x-ndjson", "application/jsonl", "application/json-lines"):
        raise ApiError(415, "unsupported_media_type", "send JSONL with Content-Type: application/x-ndjson")
    team = rules.upload_team(request, principal)
    uri, size, stored = await uploads.upload(
        Context.of(request), principal, team, request.content.iter_chunked(1 << 20),
        sha256=request.query.get("sha256") or None,  # an empty value reads as absent, as everywhere
        content_length=request.content_length)
    return json_response({"uri": uri, "bytes": size}, 201 if stored else 200)
