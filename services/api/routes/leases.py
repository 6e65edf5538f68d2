"""Lease endpoints: complete, fail, release, one lease per request or many in one. The lease token
fences each one: a token that is no longer current gets 409 and changes nothing, so a result is
committed exactly once. A batched request answers 200 with each lease's outcome: the status and
error its own request would have had."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from aiohttp import web

from minions import protocol
from minions.db.queries import Queries
from minions.logging import get_logger
from minions.nul import without_nul
from minions.redaction import redact_failure
from minions.services.api import spot_check
from minions.services.api.appkeys import LEASES, POOL, SETTINGS, STORE
from minions.services.api.auth import Principal, require
from minions.services.api.bodies import TOKEN_LIST_BYTES, json_object
from minions.services.api.errors import ApiError, conflict, forbidden, invalid
from minions.services.api.messages import decode_body
from minions.services.api.output_check import OutputMismatch
from minions.services.api.responses import json_response
from minions.services.api.verified_output import VerifiedOutput, copy_verified
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

Q = Queries("api")
log = get_logger(__name__)
routes = web.RouteTableDef()

MAX_NUMBER = protocol.MAX_NUMBER
Item = TypeVar("Item")
Outcome = TypeVar("Outcome")
# Leases of one batch verified at once (each reads its input range and output).
VERIFY_CONCURRENCY = 8

_REFUSED = {
    "lost": ("lease_lost", "this lease is no longer current (reclaimed, released or already finished)"),
    "cancelled": ("task_cancelled", "the task was cancelled; drop this work"),
    "records_mismatch": ("records_mismatch", "records does not match the subtask's record count"),
}
_COMPLETION_RULES = {"records": f"required: a whole number from 0 to {MAX_NUMBER}",
                     "seconds": f"required: a number from 0 to {MAX_NUMBER}",
                     "output": "must be a string: the output's JSONL"}
# Route caps (a body past one is 413 before it is decoded): a failure's text is kept to
# protocol.MAX_ERROR_CHARS, so a megabyte is any traceback with room to spare.
# Completes carry inline outputs (up to MAX_TOKENS of MINIONS_INLINE_OUTPUT_BYTES each, escaped) and
# keep the API's cap; every body is bounded in JSON values as well (json_bounds).
MAX_FAILURE_BYTES = 1 << 20
MAX_FAILURE_BATCH_BYTES = 16 << 20
_FAILURE_RULES = {"error": "required: what went wrong", "retryable": "must be true or false"}
_OK = protocol.to_builtins(protocol.Ok(status="ok"))


@dataclass
class _Lease:
    """One lease a request acts on: its token as sent, as a UUID, and what is known of it while it is
    current (a minion_lease_info row, or the claim's facts), None once it is not."""

    raw: str
    token: uuid.UUID
    live: Any
    cached: bool


async def _lease(request: web.Request, principal: Principal, raw: str, *, to_complete: bool = False) -> _Lease:
    """The lease `raw` names, held by one of the caller's executors (an admin may act on any).
    `to_complete`: looked up with its kept input's range, which the complete's check reads."""
    try:
        token = uuid.UUID(raw)
    except ValueError:
        raise conflict(*_REFUSED["lost"]) from None
    live = request.app[LEASES].get(token)
    cached = live is not None
    if live is None:
        live = await request.app[POOL].fetchrow(Q.lease_to_complete if to_complete else Q.lease_info, token)
    if live is not None and principal.role != "admin" and live["owner"] != principal.token_id:
        raise forbidden("this lease is held by an executor of another token", "not_your_lease")
    return _Lease(raw, token, live, cached)


async def _still_live(request: web.Request, lease: _Lease) -> bool:
    """Whether a lease known from its claim is still current (asked only when a check failed, so that a
    stale lease is refused as stale, not for what its output holds)."""
    return not lease.cached or await request.app[POOL].fetchrow(Q.lease_info, lease.token) is not None


# A complete that counts though it commits nothing yet, or commits another's result (sql/schema/11_checks.sql): a result
# held for its check, or a replica's vote. The executor is answered as for any complete.
_CHECKED = ("held", "agreed", "settled", "disputed", "no_quorum")


def _verdict(verdict: str) -> None:
    if verdict in ("ok", "repeat") or verdict in _CHECKED:
        return
    code, message = _REFUSED[verdict]
    if verdict == "records_mismatch":
        raise invalid({"records": message})
    raise conflict(code, message)


# ---------------------------------------------------------------- complete


@dataclass
class _Completing:
    lease: _Lease
    records: int
    seconds: float | None
    verified: VerifiedOutput | None
    inline: bool


async def _prepare_complete(request: web.Request, lease: _Lease, completion: protocol.Completion) -> _Completing:
    """The lease's output verified and copied to its result key (or, small and inline, kept for the
    row: sql/schema/07_results.sql); ApiError when it cannot be
    committed (a stale lease is left to the SQL, which says why)."""
    inline = None if completion.output is None else completion.output.encode()
    limit = request.app[SETTINGS].inline_output_bytes
    if inline is not None and len(inline) > limit:
        raise ApiError(413, "too_large", f"an inline output may hold at most {limit:,} bytes (MINIONS_INLINE_OUTPUT_"
                                         "BYTES); PUT it to the lease's output URL and complete without `output`")
    verified = None
    if lease.live is not None:
        try:
            if completion.records != lease.live["records"]:
                _verdict("records_mismatch")
            verified = await _verify(request.app[STORE], lease.live, lease.token, inline,
                                     await _input_of(request, lease), request.app[SETTINGS].result_in_database_bytes)
        except ApiError:
            if await _still_live(request, lease):
                raise
            lease.live = None
    return _Completing(lease, completion.records, completion.seconds, verified, inline is not None)


async def _input_of(request: web.Request, lease: _Lease) -> bytes | None:
    """The lease's input range if the API has it at hand (kept from its claim), or when the task's
    input is kept in the database (sql/schema/08_inputs.sql): then from the lease's lookup, or read now. None: the
    check reads it from the input object."""
    data = request.app[LEASES].input_of(lease.token)
    if data is not None or lease.live["input_uri"] is not None:
        return data
    data = lease.live.get("input_data")  # lease_to_complete's row has it; a claim's facts do not
    if data is None:
        data = await request.app[POOL].fetchval(Q.kept_input, lease.live["task_id"], lease.live["byte_start"],
                                                lease.live["byte_end"])
    return cast(bytes | None, data)  # None: the task went meanwhile (the check says its input is gone)


async def _finish_complete(request: web.Request, done: _Completing, verdict: str) -> None:
    store = request.app[STORE]
    if verdict == "replica":  # a spot check's replica: compared with the held results, then its vote
        verdict = await spot_check.vote(request.app[POOL], store, request.app[SETTINGS], done.lease.token,
                                        done.lease.live["kind"], done.records, done.seconds, _copy(done))
    if verdict not in ("ok", "held", "disputed", "settled") and done.verified is not None \
            and done.verified.key is not None:
        # This call's copy was not committed (the lease ended meanwhile, or a concurrent complete of
        # the same lease won, or its vectors' length is not the task's): nothing refers to it.
        await _discard(store, done.verified.key)
    if verdict == "dimension_mismatch":  # the lease stays live, as for any output_mismatch
        raise await _dimension_mismatch(request, done)
    if verdict != "records_mismatch":
        request.app[LEASES].forget(done.lease.token)
    _verdict(verdict)
    if (verdict == "ok" or verdict in _CHECKED) and done.lease.live is not None and not done.inline:
        # The committed bytes live on under the result key; the attempt's object is no longer read.
        await _discard(store, done.lease.live["output_key"])


async def _dimension_mismatch(request: web.Request, done: _Completing) -> ApiError:
    """The 422 for an output whose vectors are not as long as those the task committed (sql/schema/07_results.sql)."""
    assert done.verified is not None and done.lease.live is not None
    pinned = await request.app[POOL].fetchval(Q.task_dimension, done.lease.live["task_id"])
    verified = done.verified
    return ApiError(422, "output_mismatch", f"the output does not answer the subtask's records: output line "
                                            f"{verified.dimension_line}: `embedding` has {verified.dimension} "
                                            f"dimensions; the task's results have {pinned}")


def _copy(done: _Completing) -> tuple[str | None, bytes | None, int | None, bytes | None, int | None]:
    """The complete's verified copy as minion_complete takes it: result key, SHA-256, size, kept bytes,
    vector length."""
    verified = done.verified
    if verified is None:
        return None, None, None, None, None
    return verified.key, verified.sha256, verified.size, verified.kept, verified.dimension


@routes.post("/api/v1/leases/{token}/complete")
async def complete(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    raw = request.match_info["token"]
    lease = await _lease(request, principal, raw, to_complete=True)  # 403/409 before the body is read
    completion = decode_body(await json_object(request), protocol.Completion, _COMPLETION_RULES)
    done = await _prepare_complete(request, lease, completion)
    verdict = await request.app[POOL].fetchval(Q.complete, done.lease.token, done.records, done.seconds, *_copy(done))
    await _finish_complete(request, done, verdict)
    return json_response(_OK)


@routes.post("/api/v1/leases/complete")
async def complete_batch(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    batch = decode_body(await json_object(request), protocol.CompletionBatch)
    gate = asyncio.Semaphore(VERIFY_CONCURRENCY)

    async def prepare(item: protocol.LeaseCompletion) -> _Completing:
        async with gate:
            return await _prepare_complete(request, await _lease(request, principal, item.token, to_complete=True),
                                           item)

    prepared = await _each(batch.leases, prepare)
    ready = _in_lock_order([p for p in prepared if isinstance(p, _Completing)])
    copies = [_copy(d) for d in ready]
    rows = await request.app[POOL].fetch(
        Q.complete_batch, [d.lease.token for d in ready], [d.records for d in ready], [d.seconds for d in ready],
        [c[0] for c in copies], [c[1] for c in copies], [c[2] for c in copies], [c[3] for c in copies],
        [c[4] for c in copies])
    verdicts = {id(d): row["verdict"] for d, row in zip(ready, rows, strict=True)}

    async def finish(item: _Completing | ApiError) -> None:
        if isinstance(item, ApiError):
            raise item
        await _finish_complete(request, item, verdicts[id(item)])

    outcomes = await _each(prepared, finish)
    return _batch_reply([item.token for item in batch.leases], outcomes)


def _in_lock_order(items: list[_Completing]) -> list[_Completing]:
    """By (task, subtask): two batches then lock subtask and task rows in the same order."""
    return sorted(items, key=lambda done: _lock_key(done.lease))


def _lock_key(lease: _Lease) -> tuple[int, int, str]:
    live = lease.live
    return (live["task_id"], live["subtask_id"], lease.raw) if live is not None else (0, 0, lease.raw)


async def _verify(store: ObjectStore, live: Any, token: uuid.UUID, inline: bytes | None,
                  input_data: bytes | None, keep_up_to: int) -> VerifiedOutput:
    """The output checked against the subtask's input and copied to its result key, or kept for the
    row when inline and at most `keep_up_to` bytes; 409
    output_missing or 422 output_mismatch (the lease stays live: the executor may fix it and
    complete again, or fail it)."""
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


# ---------------------------------------------------------------- fail and release


def _error_text(failure: protocol.Failure, lease: _Lease) -> str:
    # The text is the executor's, shown to the task's team in /subtasks and results: secrets in it
    # (any lease's token, a signed URL, an API token) are redacted before it is stored, logged or shown.
    text = failure.error[:protocol.MAX_ERROR_CHARS]
    return str(without_nul(redact_failure(text, known=(str(lease.token), lease.raw))))


def _failed(request: web.Request, lease: _Lease, verdict: str, error: str, retryable: bool) -> None:
    request.app[LEASES].forget(lease.token)
    _verdict(verdict)
    # Named by task and subtask, never by token.
    subtask = f"{lease.live['task_id']}/{lease.live['subtask_id']}" if lease.live is not None else None
    log.info("lease_failed", subtask=subtask, error=error[:200], retryable=retryable)


@routes.post("/api/v1/leases/{token}/fail")
async def fail(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    lease = await _lease(request, principal, request.match_info["token"])
    failure = decode_body(await json_object(request, limit=MAX_FAILURE_BYTES), protocol.Failure, _FAILURE_RULES)
    if not failure.error.strip():
        raise invalid({"error": _FAILURE_RULES["error"]})
    error = _error_text(failure, lease)
    verdict = await request.app[POOL].fetchval(Q.fail, lease.token, error, failure.retryable)
    _failed(request, lease, verdict, error, failure.retryable)
    return json_response(_OK)


@routes.post("/api/v1/leases/fail")
async def fail_batch(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    batch = decode_body(await json_object(request, limit=MAX_FAILURE_BATCH_BYTES), protocol.FailureBatch)

    async def look_up(item: protocol.LeaseFailure) -> _Lease:
        if not item.error.strip():
            raise invalid({"error": _FAILURE_RULES["error"]})
        return await _lease(request, principal, item.token)

    found = await _each(batch.leases, look_up)
    ready = sorted(((lease, item) for lease, item in zip(found, batch.leases, strict=True)
                    if isinstance(lease, _Lease)), key=lambda pair: _lock_key(pair[0]))  # as complete's
    errors = [_error_text(item, lease) for lease, item in ready]
    rows = await request.app[POOL].fetch(Q.fail_batch, [lease.token for lease, _ in ready], errors,
                                         [item.retryable for _, item in ready])
    verdicts = {id(lease): (row["verdict"], error) for (lease, _), error, row in zip(ready, errors, rows, strict=True)}

    async def settle(pair: tuple[_Lease | ApiError, protocol.LeaseFailure]) -> None:
        lease, item = pair
        if isinstance(lease, ApiError):
            raise lease
        verdict, error = verdicts[id(lease)]
        _failed(request, lease, verdict, error, item.retryable)

    outcomes = await _each(list(zip(found, batch.leases, strict=True)), settle)
    return _batch_reply([item.token for item in batch.leases], outcomes)


@routes.post("/api/v1/leases/{token}/release")
async def release(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    lease = await _lease(request, principal, request.match_info["token"])
    request.app[LEASES].forget(lease.token)
    _verdict(await request.app[POOL].fetchval(Q.release, lease.token))
    return json_response(_OK)


@routes.post("/api/v1/leases/release")
async def release_batch(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    batch = decode_body(await json_object(request, limit=TOKEN_LIST_BYTES), protocol.ReleaseBatch)
    found = await _each(batch.leases, lambda raw: _lease(request, principal, raw))
    ready = sorted((lease for lease in found if isinstance(lease, _Lease)), key=_lock_key)  # as complete's
    rows = await request.app[POOL].fetch(Q.release_batch, [lease.token for lease in ready])
    verdicts = {id(lease): row["verdict"] for lease, row in zip(ready, rows, strict=True)}

    async def settle(lease: _Lease | ApiError) -> None:
        if isinstance(lease, ApiError):
            raise lease
        request.app[LEASES].forget(lease.token)
        _verdict(verdicts[id(lease)])

    outcomes = await _each(found, settle)
    return _batch_reply(batch.leases, outcomes)


# ---------------------------------------------------------------- batches


async def _each(items: Sequence[Item], step: Callable[[Item], Awaitable[Outcome]]) -> list[Outcome | ApiError]:
    """`step` of every item, concurrently; an item's ApiError is its outcome, not the request's."""
    async def one(item: Item) -> Outcome | ApiError:
        try:
            return await step(item)
        except ApiError as exc:
            return exc
    return list(await asyncio.gather(*(one(item) for item in items)))


def _batch_reply(tokens: Sequence[str], outcomes: Sequence[Any]) -> web.Response:
    results = [
        protocol.LeaseOutcome(token=token, status=outcome.status, error=protocol.LeaseError(
            code=outcome.code, message=outcome.message, fields=outcome.fields))
        if isinstance(outcome, ApiError) else protocol.LeaseOutcome(token=token, status=200)
        for token, outcome in zip(tokens, outcomes, strict=True)
    ]
    return json_response(protocol.to_builtins(protocol.BatchReply(results=results)))
