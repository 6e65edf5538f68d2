"""/v1/files: upload (multipart, streamed to the store, never held in memory), list, show, content,
delete."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import BodyPartReader, web

from minions.db.queries import Queries
from minions.logging import get_logger
from minions.services.api.appkeys import POOL, STORE
from minions.services.api.auth import Principal, require
from minions.services.api.bodies import query_int
from minions.services.api.errors import ApiError, invalid, not_found
from minions.services.api.openai.objects import file_object, team_scope, visible
from minions.services.api.openai.translate import new_id
from minions.services.api.responses import json_response

Q = Queries("openai")
log = get_logger(__name__)
routes = web.RouteTableDef()
PURPOSES = ("batch",)  # what clients upload; outputs are written as "batch_output"
CHUNK = 1 << 20


async def file_row(request: web.Request, principal: Principal, file_id: str) -> Any:
    row = await request.app[POOL].fetchrow(Q.file_by_id, file_id)
    if row is None or not visible(principal, row["team"]):
        raise not_found(f"file {file_id}")  # other teams' files do not exist for you
    return row


@routes.post("/v1/files")
async def upload_file(request: web.Request) -> web.Response:
    principal = require(request, "user")
    if not request.content_type.startswith("multipart/"):
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data with fields purpose and file")
    store, pool = request.app[STORE], request.app[POOL]
    reader = await request.multipart()
    purpose: str | None = None
    stored: tuple[str, int, str] | None = None  # uri, bytes, filename
    file_id = new_id("file-")
    try:
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "purpose":
                purpose = (await part.text()).strip()
            elif part.name == "file" and stored is None:
                uri, size = await store.put_stream(f"openai/files/{file_id}.jsonl", _chunks(part))
                stored = (uri, size, part.filename or "upload.jsonl")
            else:
                await part.release()
    except ValueError as exc:  # a malformed multipart body
        if stored is not None:
            await store.delete(stored[0])
        raise ApiError(400, "malformed_body", f"malformed multipart body: {exc}") from None
    problems = {}
    if purpose not in PURPOSES:
        problems["purpose"] = "must be batch"
    if stored is None:
        problems["file"] = "is required"
    elif stored[1] == 0:
        problems["file"] = "is empty"
    if problems:
        if stored is not None:
            await store.delete(stored[0])
        raise invalid(problems)
    assert stored is not None and purpose is not None
    uri, size, filename = stored
    await pool.execute(Q.add_file, file_id, principal.team, purpose, filename[:512], size, uri,
                       principal.token_id)
    log.info("openai_file_uploaded", file_id=file_id, bytes=size)
    return json_response(file_object(await pool.fetchrow(Q.file_by_id, file_id)))


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(CHUNK):
        yield chunk


@routes.get("/v1/files")
async def list_files(request: web.Request) -> web.Response:
    principal = require(request, "user")
    limit = query_int(request, "limit", 10000, 1, 10000)
    rows = await request.app[POOL].fetch(Q.list_files, team_scope(principal), request.query.get("purpose") or None,
                                         request.query.get("after") or None, limit + 1)
    data = [file_object(r) for r in rows[:limit]]
    return json_response({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                          "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit})


@routes.get("/v1/files/{file_id}")
async def show_file(request: web.Request) -> web.Response:
    principal = require(request, "user")
    return json_response(file_object(await file_row(request, principal, request.match_info["file_id"])))


@routes.get("/v1/files/{file_id}/content")
async def file_content(request: web.Request) -> web.StreamResponse:
    principal = require(request, "user")
    row = await file_row(request, principal, request.match_info["file_id"])
    response = web.StreamResponse(headers={"Content-Type": "application/jsonl",
                                           "Content-Length": str(row["bytes"])})
    await response.prepare(request)
    async for chunk in request.app[STORE].read(row["uri"]):
        await response.write(chunk)
    await response.write_eof()
    return response


@routes.delete("/v1/files/{file_id}")
async def delete_file(request: web.Request) -> web.Response:
    principal = require(request, "user")
    file_id = request.match_info["file_id"]
    await file_row(request, principal, file_id)
    uri = await request.app[POOL].fetchval(Q.delete_file, file_id)
    if uri is None:
        raise not_found(f"file {file_id}")
    # Safe while a batch runs: a batch reads its input file once, at submission, into its task's
    # own copy of the records.
    await request.app[STORE].delete(uri)
    return json_response({"id": file_id, "object": "file", "deleted": True})
