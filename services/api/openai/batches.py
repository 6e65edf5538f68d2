"""/v1/batches: create (the input file checked and translated into a Minions task), show, cancel,
list. Team from the token; project from metadata["project"] or "openai", priority from
metadata["priority"] (within the team's cap for a user, as a native task's) (docs/OPENAI.md)."""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from minions.kinds import DEFAULT_SUBTASK_SIZE
from minions.logging import get_logger
from minions.names import is_name
from minions.nul import NUL_RULE
from minions.services.api.appkeys import CLUSTER, SETTINGS, STORE
from minions.services.api.http.auth import Principal, require
from minions.services.api.http.bodies import json_object, query_int
from minions.services.api.http.errors import ApiError, conflict, invalid, not_found
from minions.services.api.http.responses import json_response
from minions.services.api.openai.files import file_row
from minions.services.api.openai.finalize import settle
from minions.services.api.openai.gateway import openai_gateway
from minions.services.api.openai.lines import batched, bounded_lines
from minions.services.api.openai.objects import batch_object, query_text, team_scope, visible
from minions.services.api.openai.translate import ENDPOINT_KIND, new_id
from minions.services.api.openai.validate import InputCheck
from minions.services.api.tasks.priority_cap import capped, refused_above_cap
from minions.task_fields import PLACEMENTS

log = get_logger(__name__)
routes = web.RouteTableDef()
DEFAULT_TEAM = "openai"  # for a token scoped to no team, unless metadata names one
DEFAULT_PROJECT = "openai"
WINDOW = re.compile(r"([0-9]{1,6})(h|m|s)")
MAX_WINDOW_S = 7 * 24 * 3600
PRIORITY = re.compile(r"[+-]?[0-9]{1,4}")  # ASCII digits: int() also takes other scripts' digits
MIN_PRIORITY, MAX_PRIORITY = -1000, 1000  # a native task's (minions/task_fields.py)
# A batch's body is a few ids and at most 16 metadata values: nothing bigger is read, let alone decoded.
MAX_BODY_BYTES = 64 * 1024


def _window_s(value: Any) -> float | None:
    match = WINDOW.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    seconds = int(match[1]) * {"h": 3600, "m": 60, "s": 1}[match[2]]
    return float(seconds) if 1 <= seconds <= MAX_WINDOW_S else None


def _metadata_problem(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > 16:
        return "must be an object of at most 16 string values"
    for key, value in metadata.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512 or "\x00" in key + value:
            return "keys up to 64 characters, values strings up to 512"
    return None


def _placement(principal: Principal, metadata: dict[str, str]) -> tuple[str, str, int]:
    """The batch task's team, project and priority, from the token and the batch's metadata."""
    team = principal.team or metadata.get("team") or DEFAULT_TEAM
    project = metadata.get("project") or DEFAULT_PROJECT
    problems = {}
    if principal.team is not None and principal.role != "admin" and metadata.get("team", team) != team:
        problems["metadata.team"] = f"your token is scoped to team {principal.team}"
    for key, value in (("metadata.team", team), ("metadata.project", project)):
        if not is_name(value):
            problems[key] = "not a valid name (1-64 of A-Za-z0-9._-, starting alphanumeric)"
    if metadata.get("placement", "any") not in PLACEMENTS:
        problems["metadata.placement"] = "any or trusted (trusted: only executors an admin vouched for run it)"
    priority = _priority(metadata.get("priority", "0"))
    if priority is None:
        problems["metadata.priority"] = (f"an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, as a string "
                                         "(metadata values are strings)")
    if problems:
        raise invalid(problems)
    assert priority is not None
    return team, project, priority


def _priority(value: str) -> int | None:
    """A native task's priority written as metadata: "-3", "0", "+5" (never "²" or "1_000")."""
    if not PRIORITY.fullmatch(value):
        return None
    priority = int(value)
    return priority if MIN_PRIORITY <= priority <= MAX_PRIORITY else None


@routes.post("/v1/batches")
async def create_batch(request: web.Request) -> web.Response:
    principal = require(request, "user")
    body = await json_object(request, limit=MAX_BODY_BYTES)
    problems = {}
    endpoint = body.get("endpoint")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINT_KIND:  # (a dict or list is unhashable)
        problems["endpoint"] = f"must be one of {', '.join(ENDPOINT_KIND)}"
    window_s = _window_s(body.get("completion_window"))
    if window_s is None:
        problems["completion_window"] = "must be a duration such as 24h, 90m or 30s (at most 168h)"
    if not isinstance(body.get("input_file_id"), str):
        problems["input_file_id"] = "is required"
    elif "\x00" in body["input_file_id"]:
        problems["input_file_id"] = NUL_RULE
    if (problem := _metadata_problem(body.get("metadata"))) is not None:
        problems["metadata"] = problem
    unknown = sorted(set(body) - {"input_file_id", "endpoint", "completion_window", "metadata"})
    for key in unknown:
        problems[key] = "unknown field"
    if problems:
        raise invalid(problems)
    assert isinstance(endpoint, str) and window_s is not None
    metadata = body.get("metadata") or {}
    team, project, priority = _placement(principal, metadata)
    gateway = openai_gateway(request.app)
    if capped(principal):  # before the input is read or copied; the submission judges it again
        with refused_above_cap(team, priority):
            await gateway.priority_within_cap(team=team, priority=priority, capped=True)
    source = await file_row(request, principal, body["input_file_id"])
    if source["purpose"] != "batch":
        raise invalid({"input_file_id": f"the file's purpose is {source['purpose']}, not batch"})

    store, cluster = request.app[STORE], request.app[CLUSTER]
    batch_id = new_id("batch_")
    max_line = request.app[SETTINGS].openai_max_request_bytes
    check = InputCheck(endpoint, max_line)
    lines = bounded_lines(store.read(source["uri"]), max_line)
    input_uri, _ = await store.put_stream(f"inputs/openai/{batch_id}.jsonl", batched(check.records(lines)))
    kind = ENDPOINT_KIND[endpoint]
    if check.requests == 0:
        check.error(1, "empty_file", "the input file holds no requests")
    elif check.model is not None and not await gateway.model_known(kind=kind, model=check.model):
        # Only a model no executor ever advertised fails here: one the pool knows waits for an
        # executor within the batch's window (volunteer machines sleep, an agent may be loading).
        check.error(check.model_line, "model_not_found",
                    f"no executor serves {kind} with model {check.model!r} (none ever advertised it; "
                    "GET /v1/models lists those known)", "body.model")
    if check.errors:
        await store.delete(input_uri)
        if check.error_count > len(check.errors):
            check.errors.append({"code": "too_many_errors", "line": None, "param": None,
                                 "message": f"{check.error_count - len(check.errors)} more errors not shown"})
        await gateway.reject_batch(batch_id=batch_id, team=team, endpoint=endpoint, input_file_id=source["id"],
                                   window=body["completion_window"], window_s=window_s,
                                   metadata=body.get("metadata"), errors=check.errors,
                                   request_total=check.requests, created_by=principal.token_id)
        log.info("openai_batch_rejected", batch_id=batch_id, errors=check.error_count)
    else:
        assert check.model is not None
        try:
            with refused_above_cap(team, priority):
                await gateway.submit_batch(
                    batch_id=batch_id, team=team, project=project, kind=kind, model=check.model,
                    params=check.params, subtask_size=DEFAULT_SUBTASK_SIZE[kind], max_attempts=cluster.max_attempts,
                    input_uri=input_uri, endpoint=endpoint, input_file_id=source["id"],
                    window=body["completion_window"], window_s=window_s, metadata=body.get("metadata"),
                    request_total=check.requests, record_total=check.records_total, created_by=principal.token_id,
                    priority=priority, capped=capped(principal))
        except ApiError:  # the cap was lowered since the check above: the copy is nobody's
            await store.delete(input_uri)
            raise
        log.info("openai_batch_submitted", batch_id=batch_id, team=team, project=project, requests=check.requests)
    return json_response(batch_object(await gateway.batch_by_id(batch_id=batch_id)))


async def _batch_row(request: web.Request, principal: Principal) -> Any:
    batch_id = request.match_info["batch_id"]
    if "\x00" in batch_id:
        raise not_found(f"batch {batch_id!r}")  # no id holds one (and the database takes none)
    gateway = openai_gateway(request.app)
    row = await gateway.batch_by_id(batch_id=batch_id)
    if row is None or not visible(principal, row["team"]):
        raise not_found(f"batch {batch_id}")
    if await settle(request, row):
        row = await gateway.batch_by_id(batch_id=batch_id)
    return row


@routes.get("/v1/batches/{batch_id}")
async def show_batch(request: web.Request) -> web.Response:
    principal = require(request, "user")
    return json_response(batch_object(await _batch_row(request, principal)))


@routes.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(request: web.Request) -> web.Response:
    principal = require(request, "user")
    row = await _batch_row(request, principal)
    batch_id = row["id"]
    gateway = openai_gateway(request.app)
    if not await gateway.end_batch(batch_id=batch_id, ending="cancel"):
        status = batch_object(row)["status"]
        if status not in ("cancelling", "cancelled"):
            raise conflict("batch_finished", f"batch is {status}; only a batch in progress can be cancelled")
    else:
        log.info("openai_batch_cancelled", batch_id=batch_id)
    await settle(request, await gateway.batch_by_id(batch_id=batch_id))
    return json_response(batch_object(await gateway.batch_by_id(batch_id=batch_id)))


@routes.get("/v1/batches")
async def list_batches(request: web.Request) -> web.Response:
    principal = require(request, "user")
    limit = query_int(request, "limit", 20, 1, 100)
    rows = await openai_gateway(request.app).list_batches(team=team_scope(principal),
                                                          after=query_text(request, "after"), limit=limit + 1)
    data = [batch_object(r) for r in rows[:limit]]
    return json_response({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                          "last_id": data[-1]["id"] if data else None, "has_more": len(rows) > limit})
