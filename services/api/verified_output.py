"""Committed results are verified and immutable: what complete writes.

At complete, `copy_verified` reads the attempt's output once, checks it against the subtask's input
and its kind's shape (output_check.OutputCheck) and writes the very bytes it checked (with secrets
in records' `error` fields redacted: output_check.py) to a result key (`results/…`) that no URL ever
names, hashing them on the way. Whatever the attempt's PUT URL writes afterwards (an S3 presigned
URL cannot be revoked) lands on an object nobody reads. Reading a result back, served only once its
bytes match the SHA-256 and size recorded here, is minions/committed_results.py: the API's results
routes and the watchdog's compaction both read.

It streams: memory is O(one chunk) per call, and hashing and JSON parsing run in worker threads,
never on the event loop. The hot path, an inline output with a small input range, is checked whole
instead: one thread hop for the check and one write, the input range as the claim read it when the
API kept it (lease_facts.py). A small inline output is not written at all: its verified bytes are
committed in the subtask's row (sql/schema/07_results.sql), where PostgreSQL checks them
against their SHA-256 and size.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

from minions.services.api.output_check import OutputCheck
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

# An inline output and an input range up to this size are checked whole, in one thread hop.
CHECK_WHOLE = 1024 * 1024
# Up to this many bytes (both sides together) the check runs on the event loop: it takes a few
# microseconds there, less than handing it to a worker thread and back costs.
CHECK_ON_LOOP = 16 * 1024


@dataclass(frozen=True)
class VerifiedOutput:
    key: str | None  # the result key the verified bytes were copied to; None when they are `kept`
    sha256: bytes
    size: int
    kept: bytes | None = None  # the verified bytes themselves, to be committed in the subtask's row
    dimension: int | None = None  # its vectors' length (an embedding output): pinned for the task at commit
    dimension_line: int = 0  # the output line of its first vector


def result_key(lease: Any, token: uuid.UUID) -> str:
    """A fresh result key for one complete of `lease`: per attempt and lease like its output key, plus
    a nonce so that two concurrent completes of one lease never write the same object."""
    return (f"results/{lease['task_id']}/{lease['subtask_id']}/{lease['attempt']}-{token}-"
            f"{secrets.token_hex(8)}.jsonl")


async def copy_verified(store: ObjectStore, lease: Any, token: uuid.UUID,
                        inline: bytes | None = None, input_data: bytes | None = None,
                        keep_up_to: int = 0) -> VerifiedOutput:
    """Check the output of a live `lease` (a minion_lease_info row) and copy it to a new result key.
    `inline`: the output as the complete carried it (else it is read from the lease's output key),
    checked and stored exactly like an uploaded one. `input_data`: the lease's input range, when the
    caller has it (else it is read). `keep_up_to`: an inline output of at most this many bytes is not
    copied but returned `kept`, for the row (MINIONS_RESULT_IN_DATABASE_BYTES), after the same check.
    Raises OutputMismatch (nothing written), ObjectNotFound when there is no output, StoreError."""
    start, end = lease["byte_start"], lease["byte_end"]
    if lease["input_uri"] is None and input_data is None:  # kept in the database: the task went
        raise StoreError(f"the input of task {lease['task_id']} is gone")
    keep = inline is not None and len(inline) <= keep_up_to
    if inline is not None and len(inline) <= CHECK_WHOLE and (input_data is not None or end - start <= CHECK_WHOLE):
        if input_data is None:
            try:
                input_data = await store.read_bytes(lease["input_uri"], start, end)
            except ObjectNotFound:
                raise StoreError(f"the task's input {lease['input_uri']} is gone") from None
        if len(input_data) + len(inline) <= CHECK_ON_LOOP:
            whole, committed = _check_whole(lease["records"], lease["kind"], input_data, inline)
        else:
            whole, committed = await asyncio.to_thread(_check_whole, lease["records"], lease["kind"], input_data,
                                                       inline)
        if keep:
            return VerifiedOutput(None, whole.sha256.digest(), whole.size, kept=committed, dimension=whole.dimension,
                                  dimension_line=whole.dimension_line)
        key = result_key(lease, token)
        await store.put_bytes(key, committed)
        return VerifiedOutput(key, whole.sha256.digest(), whole.size, dimension=whole.dimension,
                              dimension_line=whole.dimension_line)
    check = OutputCheck(lease["records"], lease["kind"])
    key = result_key(lease, token)
    # Both stores' read() is an async generator: closed below however the check ends.
    reader = cast(AsyncGenerator[bytes, None],
                  store.read(lease["input_uri"], start, end) if input_data is None else _pieces(input_data))

    async def checked() -> AsyncIterator[bytes]:
        input_done = False

        async def feed_input() -> None:
            nonlocal input_done
            while check.wants_input and not input_done:
                try:
                    piece = await anext(reader)
                except ObjectNotFound:
                    # Not the executor's fault (and not output_missing): the task's input is gone.
                    raise StoreError(f"the task's input {lease['input_uri']} is gone") from None
                except StopAsyncIteration:
                    input_done = True
                    await asyncio.to_thread(check.input_done)
                else:
                    await asyncio.to_thread(check.add_input, piece)

        output = store.read(store.uri_for(lease["output_key"])) if inline is None else _pieces(inline)
        async for chunk in output:
            committed = await asyncio.to_thread(check.add_output, chunk)
            await feed_input()
            if committed:
                yield committed
        check.finish()

    async with contextlib.aclosing(reader):
        if keep:  # checked streamed: an input range too big to check whole
            kept = b"".join([chunk async for chunk in checked()])
            return VerifiedOutput(None, check.sha256.digest(), check.size, kept=kept, dimension=check.dimension,
                                  dimension_line=check.dimension_line)
        # put_stream discards what it wrote when `checked` raises: a refused output leaves nothing.
        await store.put_stream(key, checked())
    return VerifiedOutput(key, check.sha256.digest(), check.size, dimension=check.dimension,
                          dimension_line=check.dimension_line)


def _check_whole(records: int, kind: str, input_data: bytes, output: bytes) -> tuple[OutputCheck, bytes]:
    """The streaming check fed each side whole (same verdicts, same messages), and the bytes to
    commit (`output` itself unless a record's `error` was redacted)."""
    check = OutputCheck(records, kind)
    committed = check.add_output(output)
    check.add_input(input_data)
    check.input_done()
    check.finish()
    return check, committed


async def _pieces(data: bytes, size: int = 1024 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]
