"""The lease protocol over HTTP: an executor's long-poll claim and heartbeat, and complete, fail,
release of one lease per request or many in one. A batched request answers 200 with each lease's
outcome: the status and error its own request would have had. Each handler decodes, calls its use
case (claims.py, heartbeats.py, complete.py, failing.py) and encodes."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from aiohttp import web

from minions import protocol
from minions.services.api.context import Context
from minions.services.api.http.auth import require
from minions.services.api.http.bodies import TOKEN_LIST_BYTES, json_object, path_uuid, query_float, query_int
from minions.services.api.http.errors import ApiError, invalid
from minions.services.api.http.messages import decode_body
from minions.services.api.http.responses import json_response
from minions.services.api.leasing import claims, complete, failing, heartbeats, leases
from minions.services.api.leasing.leases import Lease

routes = web.RouteTableDef()

MAX_NUMBER = protocol.MAX_NUMBER
Item = TypeVar("Item")
Outcome = TypeVar("Outcome")
# Leases of one batch verified at once (each reads its input range and output).
VERIFY_CONCURRENCY = 8

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


def _caller(request: web.Request) -> tuple[uuid.UUID, int | None]:
    """The executor of the path, and the caller's API token the SQL checks it against (None: an
    admin, who may act for any executor)."""
    principal = require(request, "executor")
    executor_id = path_uuid(request, "executor_id", "executor")
    return executor_id, None if principal.role == "admin" else principal.token_id


def _hung_up(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


@routes.post("/api/v1/executors/{executor_id}/claim")
async def claim(request: web.Request) -> web.Response:
    executor_id, owner = _caller(request)
    ctx = Context.of(request)
    settings = ctx.settings
    # A longer wait than the server allows is cut to its longest, not refused; so is a larger max.
    wait = min(query_float(request, "wait", settings.long_poll_s, 0, 86400), settings.long_poll_s)
    # Without `max`, the first protocol's single lease; with it, a LeaseBatch of up to that many.
    batched = bool(request.query.get("max"))
    # params=once: each task's params once per answer (params_from), not once per lease.
    sharing = request.query.get("params") or "each"  # empty reads as absent, as for every query parameter
    if sharing not in ("each", "once"):
        raise invalid({"params": "each or once"})
    most = min(query_int(request, "max", 1, 1, protocol.MAX_NUMBER), settings.max_claim)
    won = await claims.claim(ctx, executor_id, owner, most=most, wait_s=wait, batched=batched,
                             params_once=sharing == "once", hung_up=lambda: _hung_up(request))
    if won is None:
        return web.Response(status=204)
    return json_response(protocol.to_builtins(won))


@routes.post("/api/v1/executors/{executor_id}/heartbeat")
async def heartbeat(request: web.Request) -> web.Response:
    executor_id, owner = _caller(request)
    beat = decode_body(await json_object(request, optional=True, limit=TOKEN_LIST_BYTES), protocol.Heartbeat,
                       {"leases": f"must be a list of at most {protocol.MAX_TOKENS} lease tokens (strings)"})
    reply = await heartbeats.beat(Context.of(request), executor_id, owner, beat.leases)
    return json_response(protocol.to_builtins(reply))


# ---------------------------------------------------------------- complete


@routes.post("/api/v1/leases/{token}/complete")
async def complete_one(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    ctx = Context.of(request)
    lease = await leases.find(ctx, principal, request.match_info["token"], to_complete=True)  # before the body
    completion = decode_body(await json_object(request), protocol.Completion, _COMPLETION_RULES)
    done = await complete.prepare(ctx, lease, completion)
    await complete.finish(ctx, done, await complete.commit(ctx, done))
    return json_response(_OK)


@routes.post("/api/v1/leases/complete")
async def complete_batch(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    ctx = Context.of(request)
    batch = decode_body(await json_object(request), protocol.CompletionBatch)
    gate = asyncio.Semaphore(VERIFY_CONCURRENCY)

    async def prepare(item: protocol.LeaseCompletion) -> complete.Completing:
        async with gate:
            return await complete.prepare(ctx, await leases.find(ctx, principal, item.token, to_complete=True), item)

    prepared = await _each(batch.leases, prepare)
    ready = complete.in_lock_order([p for p in prepared if isinstance(p, complete.Completing)])
    verdicts = {id(d): v for d, v in zip(ready, await complete.commit_batch(ctx, ready), strict=True)}

    async def finish(item: complete.Completing | ApiError) -> None:
        if isinstance(item, ApiError):
            raise item
        await complete.finish(ctx, item, verdicts[id(item)])

    outcomes = await _each(prepared, finish)
    return _batch_reply([item.token for item in batch.leases], outcomes)


# ---------------------------------------------------------------- fail and release


@routes.post("/api/v1/leases/{token}/fail")
async def fail_one(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    ctx = Context.of(request)
    lease = await leases.find(ctx, principal, request.match_info["token"])
    failure = decode_body(await json_object(request, limit=MAX_FAILURE_BYTES), protocol.Failure, _FAILURE_RULES)
    if not failure.error.strip():
        raise invalid({"error": _FAILURE_RULES["error"]})
    await failing.fail(ctx, lease, failure)
    return json_response(_OK)


@routes.post("/api/v1/leases/fail")
async def fail_batch(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    ctx = Context.of(request)
    batch = decode_body(await json_object(request, limit=MAX_FAILURE_BATCH_BYTES), protocol.FailureBatch)

    async def look_up(item: protocol.LeaseFailure) -> Lease:
        if not item.error.strip():
            raise invalid({"error": _FAILURE_RULES["error"]})
        return await leases.find(ctx, principal, item.token)

    found = await _each(batch.leases, look_up)
    ready = sorted(((lease, item) for lease, item in zip(found, batch.leases, strict=True)
                    if isinstance(lease, Lease)), key=lambda pair: pair[0].lock_key())  # as complete's
    verdicts = {id(lease): outcome for (lease, _), outcome in zip(ready, await failing.fail_batch(ctx, ready),
                                                                  strict=True)}

    async def settle(pair: tuple[Lease | ApiError, protocol.LeaseFailure]) -> None:
        lease, item = pair
        if isinstance(lease, ApiError):
            raise lease
        verdict, error = verdicts[id(lease)]
        failing.settle_failure(ctx, lease, verdict, error, item.retryable)

    outcomes = await _each(list(zip(found, batch.leases, strict=True)), settle)
    return _batch_reply([item.token for item in batch.leases], outcomes)


@routes.post("/api/v1/leases/{token}/release")
async def release_one(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    ctx = Context.of(request)
    await failing.release(ctx, await leases.find(ctx, principal, request.match_info["token"]))
    return json_response(_OK)


@routes.post("/api/v1/leases/release")
async def release_batch(request: web.Request) -> web.Response:
    principal = require(request, "executor")
    ctx = Context.of(request)
    batch = decode_body(await json_object(request, limit=TOKEN_LIST_BYTES), protocol.ReleaseBatch)
    found = await _each(batch.leases, lambda raw: leases.find(ctx, principal, raw))
    ready = sorted((lease for lease in found if isinstance(lease, Lease)), key=Lease.lock_key)  # as complete's
    verdicts = {id(lease): v for lease, v in zip(ready, await failing.release_batch(ctx, ready), strict=True)}

    async def settle(lease: Lease | ApiError) -> None:
        if isinstance(lease, ApiError):
            raise lease
        failing.settle_release(ctx, lease, verdicts[id(lease)])

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
