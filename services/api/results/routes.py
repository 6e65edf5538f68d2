"""A task's results over HTTP: JSONL (the default) in input order, `?format=parts` (a compacted
task's parts as presigned GETs) and `?format=npy` (an embedding task's vectors as one array)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from minions.committed_results import ResultCorrupted
from minions.services.api.context import Context
from minions.services.api.gateway import TaskRow
from minions.services.api.http.auth import require
from minions.services.api.http.errors import conflict
from minions.services.api.http.responses import json_response
from minions.services.api.results import npy, reading
from minions.services.api.tasks.lookup import task_of_path
from minions.store.base import ObjectNotFound

routes = web.RouteTableDef()
PART_URL_S = 3600.0  # how long the presigned URLs of ?format=parts work


@routes.get("/api/v1/tasks/{team}/{project}/{name}/results")
async def task_results(request: web.Request) -> web.StreamResponse:
    principal = require(request, "user")
    row = await task_of_path(request, principal)
    ctx = Context.of(request)
    if request.query.get("format") == "parts":
        return await _result_parts(ctx, row)
    if (request.query.get("format") or "jsonl") != "jsonl":  # ?format=npy: vectors as one array
        return await npy.respond(request, ctx.gateway, ctx.store, row)
    partial = request.query.get("partial", "false").lower() in ("1", "true", "yes")
    if row["finished_at"] is None and not partial:
        raise conflict("not_finished", f"task is {row['status']}; results are ready when it ends "
                                       "(or ask for ?partial=true)")
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    try:
        async for chunk in reading.result_chunks(ctx.gateway, ctx.store, row):
            await response.write(chunk)
    except (ObjectNotFound, ResultCorrupted):
        # Logged where found. The status line is sent already, so the only honest signal left is to
        # break the stream off: the client sees an incomplete response, never a clean end.
        if request.transport is not None:
            request.transport.close()
        return response
    await response.write_eof()
    return response


async def _result_parts(ctx: Context, task: TaskRow) -> web.Response:
    """`?format=parts`: a compacted task's results as presigned GETs of its parts, in order, each with
    the SHA-256 and size the client checks. Not compacted (yet, or ever: failed and cancelled tasks
    are not): `compacted` false and no parts; the JSONL stream serves the results."""
    if task["finished_at"] is None:
        raise conflict("not_finished", f"task is {task['status']}; results are ready when it ends")
    store = ctx.store
    parts = await reading.result_parts(ctx.gateway, task)
    urls = await asyncio.gather(*(store.presign_get(store.uri_for(p["key"]), PART_URL_S) for p in parts))
    return json_response({
        "compacted": bool(parts),
        "expires_in_s": int(PART_URL_S),
        "records": sum(p["records"] for p in parts),
        "bytes": sum(p["bytes"] for p in parts),
        "parts": [{"part": p["part"], "url": url, "bytes": p["bytes"], "sha256": p["sha256"].hex(),
                   "records": p["records"], "first_subtask": p["first_subtask"],
                   "last_subtask": p["last_subtask"]} for p, url in zip(parts, urls, strict=True)],
    })
