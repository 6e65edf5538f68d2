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
from minions.services.api.bodies import json_object, without_nul
from minions.services.api.errors import ApiError, conflict, forbidden, invalid

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


async def _lease(request: web.Request) -> tuple[uuid.UUID, str | None]:
    """The lease token of the path, held by one of the caller's executors (an admin may act on any),
    and the output key it must have written; None when the token is no longer current (the lease
    functions then say why)."""
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
    return token, live["output_key"]


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
    token, output_key = await _lease(request)
    body = await json_object(request)
    records = _number(body, "records", required=True, integer=True)
    seconds = _number(body, "seconds", required=False, integer=False)
    pool, store = request.app[POOL], request.app[STORE]
    # A current lease must have written its output first; a stale one is refused by the SQL below.
    if output_key is not None and await store.size(store.uri_for(output_key)) is None:
        raise ApiError(409, "output_missing", "PUT the output to the lease's output URL before completing")
    _verdict(await pool.fetchval(Q.complete, token, records, seconds))
    return _ok()


@routes.post("/api/v1/leases/{token}/fail")
async def fail(request: web.Request) -> web.Response:
    token, output_key = await _lease(request)
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
    # Named by task and subtask (outputs/<task>/<subtask>/<attempt>-<token>.jsonl), never by token.
    subtask = "/".join((output_key or "").split("/")[1:3])
    log.info("lease_failed", subtask=subtask, error=error[:200], retryable=retryable)
    return _ok()


@routes.post("/api/v1/leases/{token}/release")
async def release(request: web.Request) -> web.Response:
    token, _ = await _lease(request)
    _verdict(await request.app[POOL].fetchval(Q.release, token))
    return _ok()
