"""The complete step: an executor's output verified, stored and committed, one lease or a batch.

1. `prepare`: the output (inline in the request, or PUT to the lease's output URL) is read once,
   checked against the subtask's input and its kind's shape (output_check.OutputCheck) and the very
   bytes checked (with secrets in records' `error` fields redacted) are copied to a result key
   (`results/…`) that no URL ever names, hashed on the way; a small inline output is not written at
   all, its verified bytes go into the subtask's row (sql/schema/07_results.sql), where PostgreSQL
   checks them against their SHA-256 and size. Whatever the attempt's PUT URL writes afterwards (an
   S3 presigned URL cannot be revoked) lands on an object nobody reads.
2. `commit` / `commit_batch`: one statement (minion_complete, minion_complete_batch) commits the
   verified copy, fenced by the lease token; a spot check's replica gets 'replica' and votes
   (spot_check.py).
3. `finish`: what the verdict leaves to do: the vote, discarding a copy nobody refers to, the 422 of
   a vector length that is not the task's, the lease forgotten, the executor's answer.

Reading a result back, served only once its bytes match the SHA-256 and size recorded here, is
minions/committed_results.py: the results routes and the watchdog's compaction both read.

It streams: memory is O(one chunk) per call, and hashing and JSON parsing run in worker threads, never
on the event loop. The hot path, an inline output with a small input range, is checked whole instead:
one thread hop for the check and one write, the input range as the claim read it when the API kept it
(lease_facts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from minions import protocol
from minions.logging import get_logger
from minions.services.api.context import Context
from minions.services.api.gateway import ResultCopy
from minions.services.api.http.errors import ApiError
from minions.services.api.leasing import leases, spot_check
from minions.services.api.leasing.leases import CHECKED, Lease
from minions.services.api.leasing.output_check import OutputCheck, OutputMismatch
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

log = get_logger(__name__)

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


def result_key(lease: Mapping[str, Any], token: uuid.UUID) -> str:
    """A fresh result key for one complete of `lease`: per attempt and lease like its output key, plus
    a nonce so that two concurrent completes of one lease never write the same object."""
    return (f"results/{lease['task_id']}/{lease['subtask_id']}/{lease['attempt']}-{token}-"
            f"{secrets.token_hex(8)}.jsonl")


async def copy_verified(store: ObjectStore, lease: Mapping[str, Any], token: uuid.UUID,
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


# ---------------------------------------------------------------- the step


@dataclass
class Completing:
    """A complete on its way: the lease, what the executor reports, and its verified copy (None when
    the lease had ended before the check, which the SQL then says)."""

    lease: Lease
    records: int
    seconds: float | None
    verified: VerifiedOutput | None
    inline: bool

    def copy(self) -> ResultCopy:
        """The verified copy as minion_complete takes it: result key, SHA-256, size, kept bytes, vector length."""
        verified = self.verified
        if verified is None:
            return None, None, None, None, None
        return verified.key, verified.sha256, verified.size, verified.kept, verified.dimension


async def prepare(ctx: Context, lease: Lease, completion: protocol.Completion) -> Completing:
    """The lease's output verified and copied to its result key (or, small and inline, kept for the
    row); ApiError when it cannot be committed (a stale lease is left to the SQL, which says why)."""
    inline = None if completion.output is None else completion.output.encode()
    limit = ctx.settings.inline_output_bytes
    if inline is not None and len(inline) > limit:
        raise ApiError(413, "too_large", f"an inline output may hold at most {limit:,} bytes (MINIONS_INLINE_OUTPUT_"
                                         "BYTES); PUT it to the lease's output URL and complete without `output`")
    verified = None
    if lease.live is not None:
        try:
            if completion.records != lease.live["records"]:
                leases.answer("records_mismatch")
            verified = await _verify(ctx.store, lease.live, lease.token, inline, await _input_of(ctx, lease),
                                     ctx.settings.result_in_database_bytes)
        except ApiError:
            if await leases.still_live(ctx, lease):
                raise
            lease.live = None
    return Completing(lease, completion.records, completion.seconds, verified, inline is not None)


async def commit(ctx: Context, done: Completing) -> str:
    """One lease's verified copy committed (minion_complete): its verdict."""
    return await ctx.gateway.complete(lease_token=done.lease.token, records=done.records, seconds=done.seconds,
                                      copy=done.copy())


async def commit_batch(ctx: Context, ready: Sequence[Completing]) -> list[str]:
    """Many leases' copies in one statement, in lock order (minion_complete_batch): their verdicts, in
    the order given."""
    rows = await ctx.gateway.complete_batch(
        lease_tokens=[d.lease.token for d in ready], records=[d.records for d in ready],
        seconds=[d.seconds for d in ready], copies=[d.copy() for d in ready])
    return [row["verdict"] for row in rows]


def in_lock_order(items: Sequence[Completing]) -> list[Completing]:
    """By (task, subtask): two batches then lock subtask and task rows in the same order."""
    return sorted(items, key=lambda done: done.lease.lock_key())


async def finish(ctx: Context, done: Completing, verdict: str) -> None:
    """What the verdict leaves to do; raises the executor's error for one that does not count."""
    store = ctx.store
    if verdict == "replica":  # a spot check's replica: compared with the held results, then its vote
        assert done.lease.live is not None
        verdict = await spot_check.vote(ctx.gateway, store, ctx.settings, done.lease.token,
                                        done.lease.live["kind"], done.records, done.seconds, done.copy())
    if verdict not in ("ok", "held", "disputed", "settled") and done.verified is not None \
            and done.verified.key is not None:
        # This call's copy was not committed (the lease ended meanwhile, or a concurrent complete of
        # the same lease won, or its vectors' length is not the task's): nothing refers to it.
        await _discard(store, done.verified.key)
    if verdict == "dimension_mismatch":  # the lease stays live, as for any output_mismatch
        raise await _dimension_mismatch(ctx, done)
    if verdict != "records_mismatch":
        ctx.leases.forget(done.lease.token)
    leases.answer(verdict)
    if (verdict == "ok" or verdict in CHECKED) and done.lease.live is not None and not done.inline:
        # The committed bytes live on under the result key; the attempt's object is no longer read.
        await _discard(store, done.lease.live["output_key"])


async def _input_of(ctx: Context, lease: Lease) -> bytes | None:
    """The lease's input range if the API has it at hand (kept from its claim), or when the task's
    input is kept in the database (sql/schema/08_inputs.sql): then from the lease's lookup, or read
    now. None: the check reads it from the input object."""
    assert lease.live is not None
    data = ctx.leases.input_of(lease.token)
    if data is not None or lease.live["input_uri"] is not None:
        return data
    data = lease.live.get("input_data")  # lease_to_complete's row has it; a claim's facts do not
    if data is None:
        data = await ctx.gateway.kept_input(task_id=lease.live["task_id"], start=lease.live["byte_start"],
                                            end=lease.live["byte_end"])
    return data  # None: the task went meanwhile (the check says its input is gone)


async def _dimension_mismatch(ctx: Context, done: Completing) -> ApiError:
    """The 422 for an output whose vectors are not as long as those the task committed
    (sql/schema/07_results.sql)."""
    assert done.verified is not None and done.lease.live is not None
    pinned = await ctx.gateway.task_dimension(task_id=done.lease.live["task_id"])
    verified = done.verified
    return ApiError(422, "output_mismatch", f"the output does not answer the subtask's records: output line "
                                            f"{verified.dimension_line}: `embedding` has {verified.dimension} "
                                            f"dimensions; the task's results have {pinned}")


async def _verify(store: ObjectStore, live: Mapping[str, Any], token: uuid.UUID, inline: bytes | None,
                  input_data: bytes | None, keep_up_to: int) -> VerifiedOutput:
    """The output checked and copied (or kept): 409 output_missing or 422 output_mismatch (the lease
    stays live: the executor may fix it and complete again, or fail it)."""
    try:
        return await copy_verified(store, live, token, inline, input_data, keep_up_to)
    except ObjectNotFound:
        raise ApiError(409, "output_missing", "PUT the output to the lease's output URL before completing") \
            from None
    except OutputMismatch as exc:
        raise ApiError(422, "output_mismatch", f"the output does not answer the subtask's records: {exc}") \
            from None


async def _discard(store: ObjectStore, key: str) -> None:
    try:
        await store.delete(store.uri_for(key))
    except StoreError as exc:  # garbage, not an error of this request
        log.warning("store_delete_failed", key=key, error=str(exc))
