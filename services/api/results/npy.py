"""`GET …/results?format=npy`: an embedding task's vectors as one NumPy .npy array (float32,
little-endian, shape (records, dims)), in input order, streamed in constant memory for pipelines
that want arrays. A record with no vector (failed, cancelled) is a row of NaN.

Complete holds every result to its shape (minions/result_shapes.py) and the task to one vector
length, which its row records. A result committed before that may break it: one in the first block
is answered 409 `malformed_result` before any byte is sent; a later one breaks the response off at
once (fewer bytes than its Content-Length), never a row made up, never a hang."""

from __future__ import annotations

import asyncio
import math
import sys
from array import array
from collections.abc import AsyncIterator

from aiohttp import web

from minions import jsoncodec, result_shapes
from minions.committed_results import ResultCorrupted
from minions.logging import get_logger
from minions.result_shapes import Malformed
from minions.services.api.gateway import ApiGateway, TaskRow
from minions.services.api.http.errors import ApiError, conflict, invalid
from minions.services.api.openai.lines import lines_of
from minions.services.api.results.reading import result_chunks
from minions.store.base import ObjectNotFound, ObjectStore

log = get_logger(__name__)

FORMATS = ("jsonl", "npy", "parts")  # jsonl and parts: answered by routes.py before this module
BLOCK = 1000  # records converted at a time


def npy_header(rows: int, dims: int) -> bytes:
    """NPY format 1.0's magic, version and header, padded so the data starts 64-byte aligned."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dims}), }}".encode()
    pad = 64 - (10 + len(header) + 1) % 64
    header += b" " * (pad % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


class _BadRecord(Exception):
    """A stored result that is not a vector of the task's length (committed before complete checked
    shapes): the array cannot be made."""

    def __init__(self, number: int, problem: Malformed) -> None:
        super().__init__(f"record {number} of the results: {problem}")


def _rows(lines: list[bytes], dims: int, first: int) -> bytes:
    """float32 little-endian rows for result lines (the first is record `first`); NaN rows for a
    record's failure. _BadRecord for a line that is neither a vector of `dims` nor a failure."""
    values = array("f")
    nan_row = array("f", [math.nan]) * dims
    for number, line in enumerate(lines, first):
        try:
            record = result_shapes.read_record("embedding", line, dims)
        except Malformed as exc:
            raise _BadRecord(number, exc) from None
        if "error" in record:
            values.extend(nan_row)
        else:
            values.extend(record["embedding"])
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


async def respond(request: web.Request, gateway: ApiGateway, store: ObjectStore,
                  task: TaskRow) -> web.StreamResponse:
    """The .npy response: 409 before any byte when the array cannot be made."""
    fmt = request.query.get("format") or "jsonl"  # empty reads as absent, as every query parameter does
    if fmt not in FORMATS:
        raise invalid({"format": f"must be one of {', '.join(FORMATS)}"})
    if task["kind"] != "embedding":
        raise conflict("not_embedding", f"format=npy is for embedding tasks; this one is {task['kind']}")
    if task["finished_at"] is None:
        raise conflict("not_finished", f"task is {task['status']}; an array is ready when it ends")
    rows = task["split_records"]  # a task cancelled mid-split: the records that were split
    lines = _records(lines_of(result_chunks(gateway, store, task)), rows)
    # The first block is converted before the status line: a bad record in it is a 409 (all of a
    # small task). Records before the first vector (failed ones: few, in practice) come with it.
    head: list[bytes] = []
    dims = task["embedding_dimension"] or 0  # NULL: results committed before it was recorded
    async for line in lines:
        head.append(line)
        if not dims:
            dims = _length(line)
        if dims and len(head) >= BLOCK:
            break
    if dims == 0:
        raise ApiError(409, "no_vectors", "the task has no vector to make an array of")
    try:
        first = await asyncio.to_thread(_rows, head, dims, 1)
    except _BadRecord as exc:
        raise conflict("malformed_result", f"{exc}; it was committed before complete checked results by "
                                           "shape, so the task's vectors cannot form an array") from None
    response = web.StreamResponse(headers={
        "Content-Type": "application/octet-stream",
        "Content-Disposition": f'attachment; filename="{task["name"]}.npy"',
        "Content-Length": str(len(npy_header(rows, dims)) + rows * dims * 4)})
    await response.prepare(request)
    await response.write(npy_header(rows, dims) + first)
    total = len(head)
    try:
        pending: list[bytes] = []
        async for line in lines:
            pending.append(line)
            if len(pending) >= BLOCK:
                await response.write(await asyncio.to_thread(_rows, pending, dims, total + 1))
                total += len(pending)
                pending = []
        if pending:
            await response.write(await asyncio.to_thread(_rows, pending, dims, total + 1))
            total += len(pending)
    except (_BadRecord, ObjectNotFound, ResultCorrupted) as exc:
        # The status line is sent: the only honest signal left is to break the response off now (the
        # client sees fewer bytes than Content-Length promised, at once, never a hang).
        log.error("npy_results_broken_off", task_id=task["id"], error=str(exc))
        if request.transport is not None:
            request.transport.close()
        return response
    # Fewer lines than records would be a bug upstream; NaN rows keep the array's promised shape.
    if total < rows:
        filler = array("f", [math.nan]) * dims
        if sys.byteorder == "big":
            filler.byteswap()
        await response.write(filler.tobytes() * (rows - total))
    await response.write_eof()
    return response


async def _records(lines: AsyncIterator[bytes], rows: int) -> AsyncIterator[bytes]:
    """The results' non-blank lines, at most `rows`."""
    count = 0
    async for line in lines:
        if count >= rows:
            return
        if line.strip():
            count += 1
            yield line


def _length(line: bytes) -> int:
    """The length of a line's vector (0: none, or not a list)."""
    try:
        vector = jsoncodec.loads(line).get("embedding")
    except (ValueError, AttributeError):
        return 0
    return len(vector) if isinstance(vector, list) else 0
