"""/v1/files: upload (multipart, streamed to the store, never held in memory; within the size cap and
the team's input quota of POST /api/v1/inputs), list, show, content, delete (which gives the quota
its bytes back)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from minions.logging import get_logger
from minions.nul import without_nul
from minions.services.api.appkeys import GATEWAY, SETTINGS, STORE
from minions.services.api.http.auth import Principal, require
from minions.services.api.http.bodies import query_int
from minions.services.api.http.errors import ApiError, invalid, not_found
from minions.services.api.http.responses import json_response
from minions.services.api.inputs import rules as inputs
from minions.services.api.openai.gateway import FileRow, openai_gateway
from minions.services.api.openai.objects import file_object, query_text, team_scope, visible
from minions.services.api.openai.translate import new_id

log = get_logger(__name__)
routes = web.RouteTableDef()
PURPOSES = ("batch",)  # what clients upload; outputs are written as "batch_output"
CHUNK = 1 << 20
MULTIPART_OVERHEAD = 64 * 1024  # a body's bytes besides the file's: boundaries, part headers, purpose
SHORT_FIELD = 64


async def file_row(request: web.Request, principal: Principal, file_id: str) -> FileRow:
    if "\x00" in file_id:
        raise not_found(f"file {file_id!r}")  # no id holds one (and the database takes none)
    row = await openai_gateway(request.app).file_by_id(file_id=file_id)
    if row is None or not visible(principal, row["team"]):
        raise not_found(f"file {file_id}")  # other teams' files do not exist for you
    return row


@routes.post("/v1/files")
async def upload_file(request: web.Request) -> web.Response:
    """Streamed to the store, counted as it comes: a file over MINIONS_MAX_INPUT_BYTES or over the
    team's input quota is cut off (413) and nothing is kept, as with POST /api/v1/inputs."""
    principal = require(request, "user")
    if request.content_type != "multipart/form-data":
        raise ApiError(415, "unsupported_media_type", "send multipart/form-data with fields purpose and file")
    store, settings = request.app[STORE], request.app[SETTINGS]
    gateway = openai_gateway(request.app)
    cap, over = await inputs.upload_cap(request.app[GATEWAY], settings, principal.team, None)
    if request.content_length is not None and request.content_length > cap + MULTIPART_OVERHEAD:
        raise over  # refused before a byte is stored
    purpose: str | None = None
    stored: tuple[str, int, str] | None = None  # uri, bytes, filename
    file_id = new_id("file-")
    unknown: list[str] = []  # fields refused, not ignored: a client must not believe one took effect
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                continue
            if part.name == "purpose":
                purpose = await _short_text(part)
            elif part.name == "file" and stored is None:
                chunks = inputs.capped(_chunks(part), cap, over)
                uri, size = await store.put_stream(f"openai/files/{file_id}.jsonl", chunks)
                stored = (uri, size, part.filename or "upload.jsonl")
            else:
                await part.release()
                unknown.append(part.name or "")
    except BaseException as exc:  # a malformed multipart body, or one cut off (timeout, client gone)
        if stored is not None:
            await asyncio.shield(store.delete(stored[0]))  # no stored file without its row
        if isinstance(exc, ValueError | AssertionError | HttpProcessingError):
            raise ApiError(400, "malformed_body", f"malformed multipart body: {exc}") from None
        raise
    problems = {}
    if purpose not in PURPOSES:
        problems["purpose"] = "must be batch"
    if stored is None:
        problems["file"] = "is required"
    elif stored[1] == 0:
        problems["file"] = "is empty"
    for name in unknown:
        problems[name] = "only one file is taken" if name == "file" else "unknown field (purpose and file are taken)"
    if problems:
        if stored is not None:
            await store.delete(stored[0])
        raise invalid(problems)
    assert stored is not None and purpose is not None
    uri, size, filename = stored
    # A file name is informational: kept, made storable (PostgreSQL text holds neither NUL nor
    # unpaired surrogates).
    filename = without_nul(filename).encode("utf-8", "replace").decode("utf-8")[:512]
    if not await gateway.add_file_within_quota(file_id=file_id, team=principal.team, purpose=purpose,
                                               filename=filename, size=size, uri=uri,
                                               created_by=principal.token_id,
                                               quota=settings.team_input_quota_bytes):
        # A concurrent upload took the room meanwhile.
        await store.delete(uri)
        used = await gateway.team_input_bytes(team=principal.team)
        raise inputs.quota_exceeded(principal.team, used, settings.team_input_quota_bytes)
    log.info("openai_file_uploaded", file_id=file_id, bytes=size)
    return json_response(file_object(await gateway.file_by_id(file_id=file_id)))


async def _short_text(part: BodyPartReader) -> str:
    """A form field's text, read no further than SHORT_FIELD bytes (a field that says `batch` never
    needs more; a longer one is refused as not `batch` without being held)."""
    data = b""
    while len(data) <= SHORT_FIELD and (chunk := await part.read_chunk(SHORT_FIELD + 1 - len(data))):
        data += chunk
    await part.release()
    return data.decode("utf-8", "replace").strip()


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(CHUNK):
        yield chunk


@routes.get("/v1/files")
async def list_files(request: web.Request) -> web.Response:
    principal = require(request, "user")
    limit = query_int(request, "limit", 10000, 1, 10000)
    rows = await openai_gateway(request.app).list_files(team=team_scope(principal),
                                                        purpose=query_text(request, "purpose"),
                                                        after=query_text(request, "after"), limit=limit + 1)
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
    uri = await openai_gateway(request.app).delete_file(file_id=file_id)
    if uri is None:
        raise not_found(f"file {file_id}")
    # Safe while a batch runs: a batch reads its input file once, at submission, into its task's
    # own copy of the records.
    await request.app[STORE].delete(uri)
    return json_response({"id": file_id, "object": "file", "deleted": True})
