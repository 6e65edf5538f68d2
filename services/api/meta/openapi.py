"""The OpenAPI part of health_routes.py and meta_routes.py: `GET /api/v1/health` and `GET /api/v1/meta`,
and their Health and Meta schemas. openapi/document.py assembles it."""

from __future__ import annotations

from minions.kinds import ATTEMPT_OUTCOMES, KINDS, RUNNING_ATTEMPT, SUBTASK_STATES, TASK_STATUSES
from minions.services.api.openapi.components import AUTHED as _AUTHED
from minions.services.api.openapi.components import object_schema as _object
from minions.services.api.openapi.components import operation, path_item
from minions.services.api.openapi.parts import Schema
from minions.services.api.openapi.parts import ok as _ok
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses


def paths() -> dict[str, Schema]:
    return {
        "/api/v1/health": path_item(get=operation(
            "health", "health", "Whether the API is up and reaches its database", security=[],
            responses=_responses(_ok(_ref("Health"), "Up, and the database answers."),
                                 {"503": {"$ref": "#/components/responses/DatabaseUnavailable"}}),
        )),
        "/api/v1/meta": path_item(get=operation(
            "meta", "meta", "The task kinds (params, default subtask sizes) and the task statuses",
            responses=_responses(_ok(_ref("Meta"), "What this server knows."), _AUTHED),
        )),
    }


def _meta_schema() -> Schema:
    values: Schema = {"oneOf": [{"type": "number"}, {"type": "boolean"}, {"type": "string"}]}
    param = _object({"type": {"type": "string", "enum": ["boolean", "integer", "number", "string"]},
                     "minimum": {"type": "number"}, "maximum": {"type": "number"},
                     "choices": {"type": "array", "items": {"type": "string"}}, "default": values},
                    required=["type"])
    kind = _object({"default_subtask_size": {"type": "integer", "minimum": 1},
                    "params": {"type": "object", "additionalProperties": param}})
    return _object({
        "kinds": {"type": "object", "additionalProperties": kind,
                  "description": "Each kind (" + ", ".join(KINDS) + ") by name."},
        "task_statuses": {"type": "array", "items": {"type": "string", "enum": list(TASK_STATUSES)}},
        "finished_task_statuses": {"type": "array", "items": {"type": "string", "enum": list(TASK_STATUSES)}},
        "unsplit_task_statuses": {"type": "array", "items": {"type": "string", "enum": list(TASK_STATUSES)}},
        "subtask_states": {"type": "array", "items": {"type": "string", "enum": list(SUBTASK_STATES)}},
        "attempt_outcomes": {"type": "array", "items": {"type": "string", "enum": list(ATTEMPT_OUTCOMES)},
                             "description": "How an ended attempt can end."},
        "running_attempt": {"type": "string", "enum": [RUNNING_ATTEMPT],
                            "description": "The outcome a subtask's history gives the lease in progress."},
        "problem_attempt_outcomes": {"type": "array", "items": {"type": "string", "enum": list(ATTEMPT_OUTCOMES)},
                                     "description": "The outcomes of attempts whose work did not stand "
                                                    "(the subtask ran again, or failed)."},
    })


def schemas() -> dict[str, Schema]:
    return {
        "Health": _object({"status": {"type": "string", "enum": ["ok"]},
                           "database": {"type": "string", "enum": ["ok"]}}),
        "Meta": _meta_schema(),
    }
