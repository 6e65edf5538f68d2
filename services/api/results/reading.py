"""Reading a task's results: its committed outputs in input order, verified as they are read
(minions/committed_results.py), with one error line per input record that produced none, in
bounded memory. The JSONL stream, the .npy array and the /v1 lane's answers all read through here."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

from minions import jsoncodec, readahead
from minions.committed_results import (
    VERIFY_IN_MEMORY,
    ResultCompacted,
    ResultCorrupted,
    committed_uri,
    read_committed,
    read_verified,
)
from minions.logging import get_logger
from minions.records import parse_line
from minions.redaction import redact_failure
from minions.services.api.gateway import ApiGateway, ResultPartRow, ResultSubtaskRow, TaskRow
from minions.store.base import ObjectNotFound, ObjectStore

log = get_logger(__name__)
RESULT_PAGE = 200
RESULT_READ_AHEAD = 16  # committed results read at once while streaming (each ≤ VERIFY_IN_MEMORY held)


async def result_parts(gateway: ApiGateway, task: TaskRow) -> list[ResultPartRow]:
    """A compacted task's result parts in order; none while it is not (fully) compacted."""
    return await gateway.result_parts(task_id=task["id"])


async def result_chunks(gateway: ApiGateway, store: ObjectStore, task: TaskRow) -> AsyncIterator[bytes]:
    """Committed outputs in input order: a compacted task's parts, else a page of subtasks at a time,
    the next few results read ahead while one is sent (bounded memory). Raises ObjectNotFound or
    ResultCorrupted (logged) mid-stream: a caller breaks its response off, never ends it cleanly."""
    parts = await gateway.result_parts(task_id=task["id"])
    if parts:
        for part in parts:
            async for chunk in _read_checked(store, store.uri_for(part["key"]),
                                             read_verified(store, store.uri_for(part["key"]), part["bytes"],
                                                           part["sha256"])):
                yield chunk
        return
    pieces = readahead.ordered(_subtask_pages(gateway, task), functools.partial(_result_piece, gateway, store, task),
                               RESULT_READ_AHEAD)
    async for piece in pieces:
        async for chunk in piece:
            yield chunk
    if task["status"] == "cancelled" and task["input_uri"] is not None:  # (a kept input is split at submit)
        # Cancelled mid-split: the input past the split never became subtasks; its records still
        # get their line, so results hold one line per input record.
        size = await store.size(task["input_uri"])
        if size is not None and task["split_offset"] < size:
            async for line in _error_lines(gateway, store, task, task["split_offset"], size, "task cancelled"):
                yield line


async def _subtask_pages(gateway: ApiGateway, task: TaskRow) -> AsyncIterator[ResultSubtaskRow]:
    after = -1
    while True:
        page = await gateway.result_subtasks(task_id=task["id"], after=after, limit=RESULT_PAGE)
        for sub in page:
            yield sub
        if len(page) < RESULT_PAGE:
            return
        after = page[-1]["subtask_id"]


async def _result_piece(gateway: ApiGateway, store: ObjectStore, task: TaskRow,
                        sub: ResultSubtaskRow) -> AsyncIterator[bytes]:
    """One subtask's share of the results. A small committed result is read (and verified) now, ahead
    of its turn; a large one, error lines and nothing at all are produced at their turn."""
    if sub["state"] == "done":
        chunks = _read_checked(store, committed_uri(store, sub), read_committed(store, sub))
        if sub["result_bytes"] is not None and sub["result_bytes"] <= VERIFY_IN_MEMORY:
            return _each([chunk async for chunk in chunks])
        return chunks
    if sub["state"] in ("failed", "cancelled") and task["finished_at"] is not None:
        reason = sub["last_error"] if sub["state"] == "failed" else "task cancelled"
        return _error_lines(gateway, store, task, sub["byte_start"], sub["byte_end"],
                            redact_failure(reason or "failed"))
    return _each([])


async def _each(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _read_checked(store: ObjectStore, uri: str, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks` of a committed result or part, with what went wrong logged."""
    try:
        async for chunk in chunks:
            yield chunk
    except ResultCompacted:
        # A stream begun before the task's compaction, still running a grace period after it (the
        # row's bytes were dropped): the client reads again, from the parts.
        log.warning("result_compacted_meanwhile", uri=uri)
        raise
    except ObjectNotFound:
        # A committed output was removed from the store behind our back: the stream breaks off
        # (the client sees an incomplete response) rather than silently dropping records.
        log.error("committed_output_missing", uri=uri)
        raise
    except ResultCorrupted as exc:
        # Never served: the stream breaks off before any byte of this result is sent.
        log.error("committed_result_corrupted", uri=uri, error=str(exc))
        raise


async def _error_lines(gateway: ApiGateway, store: ObjectStore, task: TaskRow, start: int, end: int,
                       reason: str) -> AsyncIterator[bytes]:
    """One {"id", "error"} line per input record in bytes [start, end) that produced no result."""
    buffer = b""
    async for chunk in _input_range(gateway, store, task, start, end):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                record_id, _ = parse_line(task["kind"], line)
                yield jsoncodec.dumps_line({"id": record_id, "error": reason})
    if buffer.strip():
        record_id, _ = parse_line(task["kind"], buffer)
        yield jsoncodec.dumps_line({"id": record_id, "error": reason})


async def _input_range(gateway: ApiGateway, store: ObjectStore, task: TaskRow, start: int,
                       end: int) -> AsyncIterator[bytes]:
    """Bytes [start, end) of the task's input: from its object, or its bytes kept in the database."""
    if task["input_uri"] is not None:
        async for chunk in store.read(task["input_uri"], start, end):
            yield chunk
        return
    data = await gateway.kept_input(task_id=task["id"], start=start, end=end)
    if data is None:
        raise ObjectNotFound(f"the kept input of task {task['id']}")  # the task went meanwhile
    yield data
