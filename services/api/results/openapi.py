"""The OpenAPI part of routes.py: `GET …/results` (JSONL, npy or parts) and its ResultParts schema.
openapi/document.py assembles it."""

from __future__ import annotations

from minions.services.api.openapi.components import AUTHED as _AUTHED
from minions.services.api.openapi.components import NDJSON, operation, path_item
from minions.services.api.openapi.components import TASK_ERRORS as _TASK_ERRORS
from minions.services.api.openapi.components import TASK_PATH as _TASK_PATH
from minions.services.api.openapi.components import object_schema as _object
from minions.services.api.openapi.components import query_param as _query_param
from minions.services.api.openapi.parts import JSON, Schema
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses


def paths() -> dict[str, Schema]:
    return {
        "/api/v1/tasks/{team}/{project}/{name}/results": path_item(_TASK_PATH, get=operation(
            "taskResults", "tasks", "The results, one JSON line per input record, in input order",
            parameters=[_query_param("partial", {"type": "string", "default": "false"},
                                     "`true` (or `1`, `yes`; any case) streams what is committed so far, "
                                     "before the task ends; any other value is false."),
                        _query_param("format", {"type": "string", "enum": ["jsonl", "npy", "parts"],
                                                "default": "jsonl"},
                                     "`npy`: an embedding task's vectors as one NumPy array (float32, "
                                     "little-endian, one row per input record, NaN rows for records "
                                     "with no vector), once the task has ended. `parts`: a completed "
                                     "task's results as presigned GETs of a few large parts (JSON), "
                                     "whose concatenation is the JSONL stream.")],
            responses=_responses(
                {"200": {"description": "JSON lines: `{\"id\", \"embedding\"}`, `{\"id\", \"text\", \"usage\"}`, "
                                        "`{\"id\", \"slept_ms\"}`, or `{\"id\", \"error\"}`; "
                                        "with `format=npy`, a .npy file; with `format=parts`, the "
                                        "`ResultParts` listing.",
                         "content": {NDJSON: {"schema": {"type": "string"}},
                                     "application/octet-stream": {"schema": {"type": "string",
                                                                             "format": "binary"}},
                                     JSON: {"schema": _ref("ResultParts")}}}},
                _AUTHED, **_TASK_ERRORS,
                e409="The task has not ended and `partial` was not asked for (`not_finished`); with "
                     "`format=npy`, also a task that is not `embedding` (`not_embedding`) or has no "
                     "vector (`no_vectors`), or a stored result among its first 1000 is not a vector "
                     "of the task's length (`malformed_result`: committed before complete checked "
                     "shapes; one past them breaks the response off).",
                e422="`format` is not `jsonl`, `npy` or `parts`.",
            ),
        )),
    }


def schemas() -> dict[str, Schema]:
    return {
        "ResultParts": _object({
            "compacted": {"type": "boolean", "description": "False: no parts (yet, or ever for a failed or "
                                                            "cancelled task); read the JSONL stream."},
            "expires_in_s": {"type": "integer", "description": "How long the part URLs work."},
            "records": {"type": "integer", "minimum": 0},
            "bytes": {"type": "integer", "minimum": 0},
            "parts": {"type": "array", "items": _object({
                "part": {"type": "integer", "minimum": 0},
                "url": {"type": "string", "description": "A presigned GET straight to the object store."},
                "bytes": {"type": "integer", "minimum": 0},
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$",
                           "description": "Of the part's bytes: check it before using them."},
                "records": {"type": "integer", "minimum": 0},
                "first_subtask": {"type": "integer", "minimum": 0},
                "last_subtask": {"type": "integer", "minimum": 0},
            })},
        }),
    }
