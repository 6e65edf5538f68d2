"""GET /api/v1/meta: the kinds (with their params and default subtask sizes), the task statuses, the
subtask states and the attempt outcomes, as minions/kinds.py defines them, so the web UI and other
clients need not restate them. Any token may read them (executor tokens too): they are facts about
the server, not about anyone's tasks."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.kinds import (
    ATTEMPT_OUTCOMES,
    DEFAULT_SUBTASK_SIZE,
    FINISHED_TASK_STATUSES,
    KINDS,
    PARAMS,
    PROBLEM_ATTEMPT_OUTCOMES,
    RUNNING_ATTEMPT,
    SUBTASK_STATES,
    TASK_STATUSES,
    UNSPLIT_TASK_STATUSES,
)

routes = web.RouteTableDef()
PATH = "/api/v1/meta"


def meta_document() -> dict[str, Any]:
    return {
        "kinds": {kind: {"default_subtask_size": DEFAULT_SUBTASK_SIZE[kind],
                         "params": {name: _param(asdict(param)) for name, param in PARAMS[kind].items()}}
                  for kind in KINDS},
        "task_statuses": list(TASK_STATUSES),
        "finished_task_statuses": list(FINISHED_TASK_STATUSES),
        "unsplit_task_statuses": list(UNSPLIT_TASK_STATUSES),
        "subtask_states": list(SUBTASK_STATES),
        "attempt_outcomes": list(ATTEMPT_OUTCOMES),
        "running_attempt": RUNNING_ATTEMPT,
        "problem_attempt_outcomes": list(PROBLEM_ATTEMPT_OUTCOMES),
    }


def _param(fields: dict[str, Any]) -> dict[str, Any]:
    # Only what a param has: no "minimum": null on a boolean, no "choices": [] on free text.
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in fields.items() if value not in (None, ())}


_BODY = jsoncodec.dumps(meta_document())  # fixed for the life of the process


@routes.get(PATH)
async def meta(request: web.Request) -> web.Response:
    return web.Response(body=_BODY, content_type="application/json")
