"""The interactive lane: POST /v1/embeddings, /v1/chat/completions and /v1/completions answered
synchronously by the same pull executors. A request becomes a one-subtask task above every native
priority (split in the same transaction, sql/schema/10_openai.sql); the handler waits for the
task's end on the `task_ended` channel (the API's one LISTEN connection: no polling) and answers
with the executor's result in OpenAI's shape. A model no executor ever advertised is 404
`model_not_found`, as OpenAI answers; a known one with no executor online now is 503 with Retry-After,
at once (model_errors.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.logging import get_logger
from minions.services.api.appkeys import CLUSTER, GATEWAY, SETTINGS, STORE, WAITERS
from minions.services.api.http.auth import require
from minions.services.api.http.errors import ApiError, invalid
from minions.services.api.http.responses import json_response
from minions.services.api.openai.bounds import MAX_INPUTS, read_request
from minions.services.api.openai.gateway import openai_gateway
from minions.services.api.openai.lines import lines_of
from minions.services.api.openai.model_errors import model_not_found, no_executor
from minions.services.api.openai.translate import (
    ENDPOINT_KIND,
    LineError,
    new_id,
    parse_body,
    parse_result,
    response_body,
)
from minions.services.api.results.reading import result_chunks

log = get_logger(__name__)
routes = web.RouteTableDef()
DEFAULT_TEAM = "openai"
PROJECT = "interactive"
WAIT_S = 300.0  # longest a request waits for its executor before it is cancelled (504)


class TaskEnds:
    """Handlers waiting for their task's end, woken by NOTIFY on `task_ended` (a ChannelListener of
    the API's one LISTEN connection, services/api/leasing/claim_waiters.py)."""

    channel = "task_ended"

    def __init__(self) -> None:
        self._events: dict[int, asyncio.Event] = {}
        self.listening = False

    def notified(self, payload: str) -> None:
        with contextlib.suppress(ValueError):
            event = self._events.get(int(payload))
            if event is not None:
                event.set()

    def listening_changed(self, listening: bool) -> None:
        self.listening = listening
        if not listening:  # a notification may be missed meanwhile: every waiter looks again
            for event in self._events.values():
                event.set()

    @contextlib.contextmanager
    def waiting(self, task_id: int) -> Iterator[asyncio.Event]:
        event = self._events[task_id] = asyncio.Event()
        try:
            yield event
        finally:
            self._events.pop(task_id, None)


TASK_ENDS = web.AppKey("openai_task_ends", TaskEnds)


async def _answer(request: web.Request, endpoint: str) -> web.Response:
    principal = require(request, "user")
    # Bounded in bytes, values and inputs before it is decoded (bounds.py).
    body = await read_request(request, request.app[SETTINGS].openai_max_request_bytes, endpoint)
    try:
        parsed = parse_body(body, endpoint, "", "0")
    except LineError as exc:
        raise invalid({exc.param or "body": exc.message}) from None
    if endpoint == "/v1/embeddings" and len(parsed.records) > MAX_INPUTS:
        raise invalid({"input": f"at most {MAX_INPUTS} inputs per request"})
    gateway, store, cluster = openai_gateway(request.app), request.app[STORE], request.app[CLUSTER]
    ends = request.app[TASK_ENDS]
    kind = ENDPOINT_KIND[endpoint]
    availability = await gateway.model_availability(kind=kind, model=parsed.model)
    if not availability["known"]:
        raise model_not_found(parsed.model, kind)
    if not availability["online"]:
        raise no_executor(f"no online executor serves {kind} with model {parsed.model!r}; retry later")
    if not ends.listening:
        raise no_executor("this API process is reconnecting to the database; retry shortly")

    name = new_id("req_")
    data = b"".join(jsoncodec.dumps_line(r) for r in parsed.records)
    input_uri = await store.put_bytes(f"inputs/openai/{name}.jsonl", data)
    submitted = await gateway.submit_interactive(team=principal.team or DEFAULT_TEAM, project=PROJECT, name=name,
                                                 kind=kind, model=parsed.model, params=parsed.params,
                                                 max_attempts=cluster.max_attempts, input_uri=input_uri,
                                                 size=len(data), records=len(parsed.records),
                                                 created_by=principal.token_id)
    # Its subtask is claimable now: this process's waiting claims start at once (the NOTIFY wakes
    # those of the other API processes).
    request.app[WAITERS].wake(submitted["capability"])
    task = await _ended(request, ends, submitted["task_id"])
    chunks = result_chunks(request.app[GATEWAY], request.app[STORE], task)
    results = [parse_result(line) async for line in lines_of(chunks) if line.strip()]
    outcome = response_body(endpoint, body, results)
    if outcome.body is None:
        assert outcome.error is not None
        code, message = outcome.error
        if code == "malformed_result":  # committed before complete checked shapes
            raise ApiError(502, code, f"the executor's result cannot be read: {message}")
        raise ApiError(502, "executor_failed", f"the executor failed the request: {message}")
    return json_response(outcome.body)


async def _ended(request: web.Request, ends: TaskEnds, task_id: int) -> Any:
    """The task's row once it has ended. Registered before the first look, so an end notified in
    between is not missed; a request that waits too long (or whose client leaves) is cancelled."""
    gateway = openai_gateway(request.app)
    finished = False
    try:
        with ends.waiting(task_id) as event:
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while True:
                task = await gateway.task_row(task_id=task_id)
                assert task is not None  # this request's own task (a task is deleted only once ended)
                if task["finished_at"] is not None:
                    finished = True
                    return task
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    raise ApiError(504, "timeout", f"no executor answered within {WAIT_S:.0f} s")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), left)
                event.clear()
    finally:
        if not finished:  # timed out, or the client hung up: nobody will read the answer
            await asyncio.shield(gateway.cancel_task(task_id=task_id))


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    return await _answer(request, "/v1/embeddings")


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.Response:
    return await _answer(request, "/v1/chat/completions")


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.Response:
    return await _answer(request, "/v1/completions")
