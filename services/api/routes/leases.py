"""Lease endpoints: complete, fail, release. The lease token fences each one: a token that is no
longer current gets 409 and changes nothing, so a result is committed exactly once."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.db.queries import Queries
from minions.logging import get_logger
from minions.redaction import redact
from minions.services.api.appkeys import POOL, STORE
from minions.services.api.auth import require
from minions.services.api.bodies import json_object
from minions.services.api.errors import ApiError, conflict, forbidden, invalid
from minions.services.api.nul import without_nul
from minions.services.api.output_check import OutputMismatch
from minions.services.api.verified_output import VerifiedOutput, copy_verified
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

Q = Queries("api")
log = get_logger(__name__)
routes = web.RouteTableDef()

MAX_NUMBER = 2**31 - 1  # what the database's integer columns hold

_REFUSED = {
    "lost": ("lease_lost", "this lease is no longer current (reclaimed, released or already finished)"),
    "cancelled": ("task_cancelled", "the task was cancelled; drop this work"),
    "records_mismatch": ("records_mismatch", "records does not match the subtask's record count"),
}


def _ok() -> web.Response:
    return web.Response(body=jsoncodec.dumps({"status": "ok"}), content_type="application/json")


async def _lease(request: web.Request) -> tuple[uuid.UUID, Any]:
    """The lease token of the path, held by one of the caller's executors (an admin may act on any),
    and its minion_lease_info row (the output key it must have written, the records it answers
    for); None when the token is no longer current (the lease functions then say why)."""
    principal = require(request, "executor")
    try:
        token = uuid.UUID(request.match_info["token"])
    except ValueError:
        raise conflict(*_REFUSED["lost"]) from None
    live = await request.app[POOL].fetchrow(Q.lease_info, token)
    if live is None:
        return token, None
    if principal.role != "admin" and live["owner"] != principal.token_id:
        raise forbidden("this lease is held by an executor of another token", "not_your_lease")
    return token, live


def _verdict(verdict: str) -> None:
    if verdict == "ok":
        return
    code, message = _REFUSED[verdict]
    if verdict == "records_mismatch":
        raise invalid({"records": message})
    raise conflict(code, message)


def _number(body: dict[str, Any], key: str, *, required: bool, integer: bool) -> Any:
    value: Any = body.get(key)
    if value is None and not required:
        return None
    if (isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int))
            or not 0 <= value <= MAX_NUMBER):
        raise invalid({key: f"required: a {'whole ' if integer else ''}number from 0 to {MAX_NUMBER}"})
    return value


@routes.post("/api/v1/leases/{token}/complete")
async def complete(request: web.Request) -> web.Response:
    token, live = await _lease(request)
    body = await json_object(request)
    records = _number(body, "records", required=True, integer=True)
    seconds = _number(body, "seconds", required=False, integer=False)
    pool, store = request.app[POOL], request.app[STORE]
    verified = None
    if live is not None:
        # A stale lease has nothing to verify: the SQL below refuses it (or answers a retried
        # complete of a committed one).
        if records != live["records"]:
            _verdict("records_mismatch")
        verified = await _verify(store, live, token)
    verdict = await pool.fetchval(Q.complete, token, records, seconds, *(
        (verified.key, verified.sha256, verified.size) if verified else (None, None, None)))
    if verdict != "ok" and verified is not None:
        # This call's copy was not committed (the lease ended meanwhile, or a concurrent complete of
        # the same lease won): nothing refers to it.
        await _discard(store, verified.key)
    if verdict == "repeat":
        return _ok()
    _verdict(verdict)
    if live is not None:
        # The committed bytes live on under the result key; the attempt's object is no longer read.
        await _discard(store, live["output_key"])
    return _ok()


async def _verify(store: ObjectStore, live: Any, token: uuid.UUID) -> VerifiedOutput:
    """The output checked against the subtask's input and copied to its result key; 409
    output_missing or 422 output_mismatch (the lease stays live: the executor may fix it and
    complete again, or fail it)."""
    try:
        return await copy_verified(store, live, token)
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


@routes.post("/api/v1/leases/{token}/fail")
async def fail(request: web.Request) -> web.Response:
    token, live = await _lease(request)
    body = await json_object(request)
    error = body.get("error")
    retryable = body.get("retryable", True)
    if not isinstance(error, str) or not error.strip():
        raise invalid({"error": "required: what went wrong"})
    if not isinstance(retryable, bool):
        raise invalid({"retryable": "must be true or false"})
    # The text is the executor's, shown to the task's team in /subtasks and results: secrets in it
    # (this lease's token, a signed URL) are redacted before it is stored, logged or shown.
    error = redact(error[:4000], known=(str(token), request.match_info["token"]))
    _verdict(await request.app[POOL].fetchval(Q.fail, token, without_nul(error), retryable))
    # Named by task and subtask, never by token.
    subtask = f"{live['task_id']}/{live['subtask_id']}" if live is not None else None
    log.info("lease_failed", subtask=subtask, error=error[:200], retryable=retryable)
    return _ok()


@routes.post("/api/v1/leases/{token}/release")
async def release(request: web.Request) -> web.Response:
    token, _ = await _lease(request)
    _verdict(await request.app[POOL].fetchval(Q.release, token))
    return _ok()
