"""`GET …/results?format=npy`: an embedding task's vectors as one NumPy .npy array (float32,
little-endian, shape (records, dims)), in input order, streamed in constant memory for pipelines
that want arrays (issue 13, item 4). A record with no vector (failed, cancelled) is a row of NaN."""

from __future__ import annotations

import asyncio
import math
import sys
from array import array
from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.services.api.errors import ApiError, conflict, invalid
from minions.services.api.openai.lines import lines_of
from minions.services.api.routes import tasks as task_routes

FORMATS = ("jsonl", "npy", "parts")  # parts: answered by tasks.py before this module


def npy_header(rows: int, dims: int) -> bytes:
    """NPY format 1.0's magic, version and header, padded so the data starts 64-byte aligned."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dims}), }}".encode()
    pad = 64 - (10 + len(header) + 1) % 64
    header += b" " * (pad % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def _rows(lines: list[bytes], dims: int) -> bytes:
    """float32 little-endian rows for result lines; NaN rows for lines without a vector."""
    values = array("f")
    for line in lines:
        vector = jsoncodec.loads(line).get("embedding")
        if isinstance(vector, list) and len(vector) == dims:
            values.extend(vector)
        else:
            values.extend([math.nan] * dims)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


async def respond(request: web.Request, task: Any) -> web.StreamResponse:
    fmt = request.query.get("format") or "jsonl"  # empty reads as absent, as every query parameter does
    if fmt not in FORMATS:
        raise invalid({"format": f"must be one of {', '.join(FORMATS)}"})
    if task["kind"] != "embedding":
        raise conflict("not_embedding", f"format=npy is for embedding tasks; this one is {task['kind']}")
    if task["finished_at"] is None:
        raise conflict("not_finished", f"task is {task['status']}; an array is ready when it ends")
    rows = task["split_records"]  # a task cancelled mid-split: the records that were split
    lines = lines_of(task_routes._result_chunks(request, task))
    head: list[bytes] = []  # the lines before the first vector (failed records: few, in practice)
    dims = 0
    async for line in lines:
        if not line.strip():
            continue
        head.append(line)
        vector = jsoncodec.loads(line).get("embedding")
        if isinstance(vector, list) and vector:
            dims = len(vector)
            break
        if len(head) >= rows:
            break
    if dims == 0:
        raise ApiError(409, "no_vectors", "the task has no vector to make an array of")
    response = web.StreamResponse(headers={
        "Content-Type": "application/octet-stream",
        "Content-Disposition": f'attachment; filename="{task["name"]}.npy"',
        "Content-Length": str(len(npy_header(rows, dims)) + rows * dims * 4)})
    await response.prepare(request)
    await response.write(npy_header(rows, dims))
    pending, total = head, len(head)
    async for line in lines:
        if total >= rows:
            break
        if not line.strip():
            continue
        pending.append(line)
        total += 1
        if len(pending) >= 1000:
            await response.write(await asyncio.to_thread(_rows, pending, dims))
            pending = []
    # Fewer lines than records would be a bug upstream; NaN rows keep the array's promised shape.
    pending += [b"{}"] * (rows - total)
    if pending:
        await response.write(await asyncio.to_thread(_rows, pending, dims))
    await response.write_eof()
    return response
