"""The OpenAPI 3.0.3 description of the client API (API.md), built as a plain dict.

It mirrors what the server really does: request schemas are the checks of `validation.py` (a task's
fields: minions/task_fields.py) and the route modules (`additionalProperties: false` only where the
server refuses unknown fields), and each operation lists the statuses its handler and the
middlewares can answer. The schemathesis suite in tests/fuzz holds the server to it, and
tests/test_openapi.py keeps it and the router in step.
"""

from __future__ import annotations

from typing import Any

from minions import protocol
from minions.kinds import (
    ATTEMPT_OUTCOMES,
    DEFAULT_SUBTASK_SIZE,
    KINDS,
    PARAMS,
    RUNNING_ATTEMPT,
    SUBTASK_STATES,
    TASK_STATUSES,
    Param,
)
from minions.names import NAME_PATTERN
from minions.records import CHAT_ROLES, MAX_ID_LENGTH, MAX_SLEEP_MS
from minions.services.api.openai import document as openai_document
from minions.services.api.openapi_parts import JSON, Schema
from minions.services.api.openapi_parts import error as _error
from minions.services.api.openapi_parts import ok as _ok
from minions.services.api.openapi_parts import ref as _ref
from minions.services.api.openapi_parts import responses as _responses
from minions.task_fields import MAX_SUBTASK_SIZE, PLACEMENTS
from minions.team_shares import MAX_LEASES, MAX_PRIORITY_CAP, MAX_WEIGHT, MIN_PRIORITY_CAP
from minions.tokens import TOKEN_ROLES
from minions.usage import DEFAULT_SINCE, SINCE_PATTERN, SINCE_RULE, USAGE_BY

EXECUTOR_STATUSES = ["online", "busy", "idle", "offline", "lost"]
# An attempt in a subtask's history: the lease in progress, or how an ended one ended.
HISTORY_OUTCOMES = [RUNNING_ATTEMPT, *ATTEMPT_OUTCOMES]
NDJSON = "application/x-ndjson"
JSONL_MEDIA_TYPES = (NDJSON, "application/jsonl", "application/json-lines")  # what POST /api/v1/inputs takes
NOT_BLANK = r"\S"  # at least one non-whitespace character (the server strips before checking)
# Stored text cannot hold U+0000 (PostgreSQL): the server refuses it with 422 in these fields.
NO_NUL = r"^[^\u0000]*$"
NOT_BLANK_NO_NUL = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"

DESCRIPTION = """\
Minions: batch inference on idle machines. Users submit tasks (a model, a kind and JSONL input
records); executors (agents on idle machines) pull subtasks with long-poll claims, hold them under
fenced leases, and write results straight to the object store.

Every operation but `GET /api/v1/health` needs `Authorization: Bearer <token>`. Roles: `admin`
(everything), `user` (tasks of its team) and `executor` (the executor protocol). Errors share one
shape, `{"error": {"code", "message", "fields"}}`; a 500 is a bug.

Not described here: `GET`/`PUT /api/v1/store/{key}`, the local store's signed URLs. They are not
part of the client API: the server hands them out in leases (`input.url`, `output.url`), and the
signature in their query string is their only credential, like an S3 presigned URL; a lease's input
URL serves that lease's byte range alone (a `Range` outside it: 416 `range_not_signed`) and only while
the lease is live, as a PUT is taken only then (else 403 `lease_ended`), and a PUT over
`MINIONS_MAX_OUTPUT_BYTES`, default 256 MiB, is 413 `too_large` and stores nothing. This document
itself is served, without a token, at `GET /api/openapi.json`.

OpenAI's API under `/v1` (files, batches, embeddings, chat completions, completions; tag `openai`),
served with the same tokens, is described as this server takes and answers it: OpenAI's shapes, with
Minions' error shape. docs/OPENAI.md lists what of OpenAI's API is supported and every deliberate
difference.
"""


def _name(description: str) -> Schema:
    return {"type": "string", "pattern": NAME_PATTERN, "minLength": 1, "maxLength": 64,
            "description": description}


def _int(low: int, high: int, description: str | None = None) -> Schema:
    schema: Schema = {"type": "integer", "minimum": low, "maximum": high}
    if description:
        schema["description"] = description
    return schema


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def _json_body(schema: Schema, description: str, *, required: bool = True) -> Schema:
    return {"required": required, "description": description, "content": {JSON: {"schema": schema}}}


# Errors that the middlewares can give any operation that needs a token.
_AUTHED = {
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "503": {"$ref": "#/components/responses/DatabaseUnavailable"},
}
_BODY = {  # operations that read a JSON body
    "400": {"$ref": "#/components/responses/MalformedBody"},
    "408": {"$ref": "#/components/responses/RequestTimeout"},
    "413": {"$ref": "#/components/responses/TooLarge"},
}


def _path_param(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}


def _query_param(name: str, schema: Schema, description: str) -> Schema:
    # The server reads an empty value (`?team=`) as an absent one.
    return {"name": name, "in": "query", "required": False, "allowEmptyValue": True, "schema": schema,
            "description": description}


_TASK_PATH = [
    _path_param("team", _name("team"), "The task's team."),
    _path_param("project", _name("project"), "The task's project."),
    _path_param("name", _name("task name"), "The task's name."),
]
_EXECUTOR_ID = [_path_param("executor_id", {"type": "string", "format": "uuid"},
                            "The id `POST /api/v1/executors/register` returned.")]
_LEASE_TOKEN = [_path_param("token", {"type": "string", "format": "uuid"},
                            "The lease token of a claim (`lease.token`).")]


# ---------------------------------------------------------------- request schemas


def _record_id() -> Schema:
    return {
        "description": "A non-empty string of at most 256 characters, or an integer; unique within the task.",
        "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
            {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
        ],
    }


def _records_schemas() -> dict[str, Schema]:
    # Records may carry extra fields of their own: the server ignores them.
    message = {
        "type": "object",
        "required": ["role", "content"],
        "properties": {"role": {"type": "string", "enum": list(CHAT_ROLES)}, "content": {"type": "string"}},
    }
    return {
        "EmbeddingRecord": {
            "type": "object",
            "required": ["id", "text"],
            "properties": {"id": _ref("RecordId"), "text": {"type": "string"}},
        },
        "CompletionRecord": {
            "description": "A prompt, or a chat (messages); never both.",
            "oneOf": [
                {"type": "object", "required": ["id", "prompt"], "not": {"required": ["messages"]},
                 "properties": {"id": _ref("RecordId"), "prompt": {"type": "string"}}},
                {"type": "object", "required": ["id", "messages"], "not": {"required": ["prompt"]},
                 "properties": {"id": _ref("RecordId"),
                                "messages": {"type": "array", "minItems": 1, "items": message}}},
            ],
        },
        "SleepRecord": {
            "type": "object",
            "required": ["id", "ms"],
            "properties": {"id": _ref("RecordId"),
                           "ms": {"type": "number", "minimum": 0, "maximum": MAX_SLEEP_MS,
                                  "description": "How long this record sleeps, in milliseconds."}},
        },
    }


def _param(param: Param) -> Schema:
    if param.type == "integer":
        return _int(int(param.minimum or 0), int(param.maximum or 0))
    schema: Schema = {"type": param.type}
    if param.type == "number":
        schema.update({"minimum": param.minimum, "maximum": param.maximum})
    if param.choices:
        schema["enum"] = list(param.choices)
    elif param.type == "string":
        schema["pattern"] = NO_NUL
    return schema


_PARAMS: dict[str, Schema] = {kind: {name: _param(p) for name, p in params.items()} for kind, params in PARAMS.items()}
_RECORD_SCHEMA = {"embedding": "EmbeddingRecord", "completion": "CompletionRecord", "sleep": "SleepRecord"}


def _task_request(kind: str) -> Schema:
    records: Schema = {"type": "array", "minItems": 1, "items": _ref(_RECORD_SCHEMA[kind]),
                       "description": "Inline input records (ids unique)."}
    model: Schema = {"type": "string", "minLength": 1, "maxLength": 256, "pattern": NOT_BLANK_NO_NUL,
                     "description": "1-256 characters (surrounding whitespace is dropped). `name@revision` pins "
                                    "the task to executors whose fingerprint for the model is that revision."}
    if kind == "sleep":
        model = {**model, "default": "sleep"}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["team", "project", "name", "kind", "input"] + ([] if kind == "sleep" else ["model"]),
        "properties": {
            "team": _name("The team the task belongs to."),
            "project": _name("The project within the team."),
            "name": _name("The task's name, unique within (team, project)."),
            "kind": {"type": "string", "enum": [kind]},
            "model": model,
            "input": {
                "description": "Exactly one of `records` (inline) and `uri` (an object already stored).",
                "oneOf": [
                    {"type": "object", "required": ["records"], "not": {"required": ["uri"]},
                     "properties": {"records": records}},
                    {"type": "object", "required": ["uri"], "not": {"required": ["records"]},
                     "properties": {"uri": {"type": "string", "minLength": 1, "pattern": NOT_BLANK_NO_NUL,
                                            "description": "An upload of the task's team (the uri POST "
                                                           "/api/v1/inputs returned), or an s3:// URI under a "
                                                           "prefix allowed for the team."}}},
                ],
            },
            "subtask_size": _nullable({**_int(1, MAX_SUBTASK_SIZE, "Records per subtask."),
                                       "default": DEFAULT_SUBTASK_SIZE[kind]}),
            "params": _nullable({"type": "object", "additionalProperties": False,
                                 "properties": _PARAMS[kind], "description": f"Parameters of a {kind} task."}),
            "priority": {**_int(-1000, 1000, "Higher runs first. A user may set at most its team's priority cap "
                                             "(default 0, `GET /api/v1/teams`; above it: 403 "
                                             "`priority_above_cap`); an admin sets any."), "default": 0},
            "placement": _nullable({"type": "string", "enum": list(PLACEMENTS), "default": "any",
                                    "description": "Who may lease its subtasks: any executor, or only those "
                                                   "of a token an admin vouched for (`trusted`)."}),
        },
    }


def _request_schemas() -> dict[str, Schema]:
    return {
        "RecordId": _record_id(),
        **_records_schemas(),
        "EmbeddingTaskRequest": _task_request("embedding"),
        "CompletionTaskRequest": _task_request("completion"),
        "SleepTaskRequest": _task_request("sleep"),
        "TaskRequest": {
            "description": "A task submission; its `kind` decides the records and params it takes.",
            "oneOf": [_ref("EmbeddingTaskRequest"), _ref("CompletionTaskRequest"), _ref("SleepTaskRequest")],
            "discriminator": {"propertyName": "kind", "mapping": {
                "embedding": "#/components/schemas/EmbeddingTaskRequest",
                "completion": "#/components/schemas/CompletionTaskRequest",
                "sleep": "#/components/schemas/SleepTaskRequest",
            }},
        },
        "TeamShareChange": {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "description": "Any of the three; the others keep their values.",
            "properties": {
                "weight": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_WEIGHT,
                           "description": "The team's share of claims when several teams have work (default 1)."},
                "priority_cap": _int(MIN_PRIORITY_CAP, MAX_PRIORITY_CAP,
                                     "The highest priority the team's users may set (default 0)."),
                "max_leases": _int(0, MAX_LEASES, "Leases the team may hold at once (0: no cap, the default)."),
            },
        },
        "TokenRequest": {
            "type": "object",
            "required": ["role"],
            "additionalProperties": False,
            "properties": {
                "role": {"type": "string", "enum": list(TOKEN_ROLES)},
                "team": _nullable(_name("Scope the token to this team (null or absent: every team).")),
                "label": {"type": "string", "maxLength": 200, "pattern": NO_NUL,
                          "description": "A note saying who or what holds it."},
                "expires_in_s": _nullable({"type": "number", "exclusiveMinimum": True, "minimum": 0,
                                           "maximum": 10 * 365 * 86400,
                                           "description": "Seconds until it stops working (absent: never)."}),
                "owner": _nullable({"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^(?!token:)",
                                    "description": "Whom it is issued to (a person or organisation): spot checks "
                                                   "count owners (absent: the token is its own owner)."}),
                "trusted": {"type": "boolean", "description": "An executor token whose machines an admin vouches "
                                                              "for: results commit without a check and settle "
                                                              "volunteers' checks (default false: a volunteer's)."},
            },
            # Only an executor token is vouched for (422 on `trusted` otherwise).
            "anyOf": [{"properties": {"role": {"type": "string", "enum": ["executor"]}}},
                      {"properties": {"trusted": {"type": "boolean", "enum": [False]}}}],
        },
    }


# ---------------------------------------------------------------- response schemas


def _object(properties: Schema, required: list[str] | None = None, **extra: Any) -> Schema:
    return {"type": "object", "required": required if required is not None else list(properties),
            "properties": properties, **extra}


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


def _count() -> Schema:
    return {"type": "integer", "minimum": 0}


def _timestamp(nullable: bool = False) -> Schema:
    schema: Schema = {"type": "string", "format": "date-time"}
    return _nullable(schema) if nullable else schema


def _usage_counts() -> Schema:
    seconds = {"type": "number", "minimum": 0}
    return {
        "used_s": {**seconds, "description": "Compute-seconds of the team's own attempts (done, unchecked, "
                                             "candidate, failed, cancelled, superseded)."},
        "verification_s": {**seconds, "description": "Of its spot checks' replicas and outvoted results "
                                                     "(agreed, outvoted)."},
        "lost_s": {**seconds, "description": "Nobody's use: lost, released and revoked attempts."},
        "records": {"type": "integer", "minimum": 0, "description": "Records of the used attempts."},
        "attempts": {"type": "integer", "minimum": 0},
    }


def _token_schema(secret: bool = False) -> Schema:
    """A token as listed: never its secret, which only the answer to its creation carries."""
    properties: Schema = {
        "id": {"type": "integer", "minimum": 1, "description": "What `revoke` takes."},
        "prefix": _nullable({"type": "string", "description": "The secret's first characters, to recognise it."}),
        "role": {"type": "string", "enum": list(TOKEN_ROLES)},
        "team": _nullable({"type": "string", "description": "null: every team."}),
        "label": {"type": "string"},
        "status": {"type": "string", "enum": ["active", "expired", "revoked"]},
        "created_at": _timestamp(),
        "expires_at": _timestamp(nullable=True),
        "revoked_at": _timestamp(nullable=True),
        "owner": {"type": "string", "description": "Whom it was issued to; `token:<id>` when none was named."},
        "trusted": {"type": "boolean", "description": "An executor token an admin vouches for."},
    }
    if secret:
        properties = {"token": {"type": "string", "description": "The secret: shown this once, stored hashed."},
                      **properties}
    return _object(properties)


def _response_schemas() -> dict[str, Schema]:
    return {
        "Error": _object({
            "error": _object({
                "code": {"type": "string", "description": "Machine-readable, e.g. `not_found`, `lease_lost`."},
                "message": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": {"type": "string"},
                           "description": "For 422: what is wrong with each field."},
                "type": {"type": "string", "description": "OpenAI's error type, on /v1's `model_not_found`."},
                "param": {"type": "string", "nullable": True,
                          "description": "OpenAI's parameter at fault, on /v1's `model_not_found`."},
            }, required=["code", "message"]),
        }),
        "Task": _object({
            "team": {"type": "string"},
            "project": {"type": "string"},
            "name": {"type": "string"},
            "kind": {"type": "string", "enum": list(KINDS)},
            "model": {"type": "string"},
            "fingerprint": _nullable({"type": "string", "description": (
                "The model identity every result comes from: the revision of a `model` submitted as "
                "name@revision, else fixed by the first lease (`unknown:<executor id>` when that executor "
                "reported none); null until then, and for sleep.")}),
            "params": {"type": "object"},
            "priority": {"type": "integer"},
            "placement": {"type": "string", "enum": list(PLACEMENTS),
                          "description": "`trusted`: only executors of a token an admin vouched for lease it."},
            "subtask_size": {"type": "integer", "minimum": 1},
            "status": {"type": "string", "enum": list(TASK_STATUSES)},
            "subtasks": _object({**{k: _count() for k in ("total", *SUBTASK_STATES)},
                                 "running": {**_count(), "description": (
                                     "Of the leased subtasks, those being worked on now (an executor works on "
                                     "its oldest lease; the others are claimed ahead, waiting behind it).")}}),
            "records": _object({"total": _count(), "done": _count()}),
            "input_uri": _nullable({"type": "string", "description": "The input object; null when the task's "
                                    "inline records are kept in the database (MINIONS_INPUT_IN_DATABASE_BYTES)."}),
            "created_at": _timestamp(),
            "started_at": _timestamp(nullable=True),
            "finished_at": _timestamp(nullable=True),
            "output_uri": _nullable({"type": "string", "description": "Where the results are, once finished."}),
            "error": _nullable({"type": "string"}),
            "warnings": {"type": "array", "description": "What keeps an unfinished task from progressing that it "
                                                         "cannot fix itself; empty when nothing does. `unservable`: "
                                                         "no online executor serves its kind and model. "
                                                         "`starving`: work pending and no lease for "
                                                         "MINIONS_STARVATION_S while executors that could "
                                                         "serve it run other work. `held_for_check`: "
                                                         "volunteers' results held past the check wait, no "
                                                         "executor of another owner able to check them. "
                                                         "`pin_released`: its model pin was released, no "
                                                         "online executor reporting it any more. "
                                                         "`quarantined_results`: "
                                                         "results of an executor quarantined after it ended.",
                         "items": _object({"code": {"type": "string",
                                                    "enum": ["unservable", "starving", "held_for_check",
                                                             "pin_released", "quarantined_results"]},
                                           "message": {"type": "string"}})},
        }),
        "TaskList": _object({
            "tasks": {"type": "array", "items": _ref("Task")},
            "next": _nullable({"type": "string", "description": "Cursor of the next page; null on the last."}),
        }),
        "Subtask": _object({
            "subtask_id": {"type": "integer", "minimum": 0},
            "state": {"type": "string", "enum": list(SUBTASK_STATES)},
            "records": _count(),
            "attempts": _count(),
            "executor": _nullable({"type": "string", "description": "Name of the executor holding it."}),
            "leased_at": _timestamp(nullable=True),
            "done_at": _timestamp(nullable=True),
            "last_error": _nullable({"type": "string", "description": (
                "The executor's failure text, its secrets (tokens, URL signatures, every UUID) "
                "`[redacted]`; so is each attempt's `error`.")}),
            "history": {"type": "array", "items": _object({
                "attempt": {"type": "integer", "minimum": 0},
                "executor": _nullable({"type": "string"}),
                "outcome": {"type": "string", "enum": HISTORY_OUTCOMES},
                "error": _nullable({"type": "string"}),
                "started_at": _timestamp(),
                "ended_at": _timestamp(nullable=True),
                "seconds": _nullable({"type": "number"}),
                "fingerprint": _nullable({"type": "string", "description": "Of the model the attempt ran on."}),
                "precision": _nullable({"type": "string", "description": "What the executor runs that model in."}),
            })},
        }),
        "SubtaskPage": _object({
            "subtasks": {"type": "array", "items": _ref("Subtask")},
            "next": _nullable({"type": "string", "description": "Cursor of the next page; null on the last."}),
        }),
        "InputUpload": _object({"uri": {"type": "string"}, "bytes": {"type": "integer", "minimum": 1}}),
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
        "Executor": _object({
            "id": {"type": "string", "format": "uuid"},
            "name": {"type": "string"},
            "team": _nullable({"type": "string"}),
            "status": {"type": "string", "enum": EXECUTOR_STATUSES},
            "hardware": {"type": "object", "description": "Empty when `details_hidden`."},
            "details_hidden": {"type": "boolean",
                               "description": "A shared executor seen with a team's token: its hardware and "
                                              "other teams' preferences and work are not shown."},
            "kinds": {"type": "array", "items": {"type": "string"}},
            "models": {"type": "array", "items": {"type": "string"}},
            "preferences": {"type": "array", "items": {"type": "object"}},
            "current": {"type": "array", "items": {"type": "object"}, "description": "Leases it holds."},
            "fingerprints": {"type": "array", "items": _object({
                "model": {"type": "string"}, "fingerprint": {"type": "string"},
                "precision": _nullable({"type": "string"}), "backend": _nullable({"type": "string"}),
                "proofs": _nullable({"type": "integer", "minimum": 1}),
            }), "description": "What it loads for each model, as it registered; empty for an agent that reports "
                               "none (each of its models then counts as its own, `unknown:<executor id>`)."},
            "trust": _object({
                "agreements": {"type": "integer", "minimum": 0}, "disagreements": {"type": "integer", "minimum": 0},
                "trusted": {"type": "boolean"}, "quarantined_at": _timestamp(nullable=True),
                "quarantine_reason": _nullable({"type": "string"}),
                "vouched": {"type": "boolean", "description": "Its token was created `trusted` by an admin: its "
                                                              "results are never run again and it never loses a vote."},
                "owner": {"type": "string", "description": "Whom its token was issued to (else `token:<id>`): "
                                                           "no replica of its results runs on a machine of the "
                                                           "same owner."},
            }, description="Its spot checks: results of others it agreed with, quorums it lost, "
                           "whether only the random share of its results is checked, and its quarantine."),
            "registered_at": _timestamp(),
            "last_heartbeat_at": _timestamp(nullable=True),
        }),
        "ExecutorList": _object({"executors": {"type": "array", "items": _ref("Executor")}}),
        "UsageRow": _object({
            "team": _nullable({"type": "string"}),
            "executor_id": _nullable({"type": "string", "format": "uuid"}),
            "executor": _nullable({"type": "string"}),
            "owner": _nullable({"type": "string", "description": "The label of the API token the executor "
                                                                 "registered with (`token <id>` when it has none)."}),
            **_usage_counts(),
        }, description="One team's, executor's or owner's usage (`by`); what it is not grouped by is null."),
        "Usage": _object({
            "since": _timestamp(), "team": _nullable({"type": "string"}),
            "by": {"type": "string", "enum": list(USAGE_BY)},
            "usage": {"type": "array", "items": _ref("UsageRow")},
            "totals": _object(_usage_counts()),
        }),
        "Token": _token_schema(),
        "CreatedToken": _token_schema(secret=True),
        "TokenList": _object({"tokens": {"type": "array", "items": _ref("Token")}}),
        "TeamShare": _object({
            "team": {"type": "string"},
            "weight": {"type": "number", "description": "Its share of claims when several teams have work."},
            "priority_cap": {"type": "integer", "description": "The highest priority its users may set."},
            "max_leases": {"type": "integer", "minimum": 0, "description": "Leases it may hold at once (0: no cap)."},
            "updated_at": _timestamp(nullable=True) | {"description": "When an admin last set it; null: the defaults."},
        }),
        "TeamShareList": _object({"teams": {"type": "array", "items": _ref("TeamShare")}}),
        "Health": _object({"status": {"type": "string", "enum": ["ok"]},
                           "database": {"type": "string", "enum": ["ok"]}}),
        "Meta": _meta_schema(),
    }


# ---------------------------------------------------------------- operations


def _paths() -> dict[str, Schema]:
    task_errors = {"e403": "The token's role is not `user` (`wrong_role`).",
                   "e404": "No such task, or one of a team the token cannot see."}
    executor_errors = {"e403": "Not an executor token (`wrong_role`), or the executor was registered with "
                               "another token (`not_your_executor`).",
                       "e404": "No such executor."}
    lease_errors = {"e403": "Not an executor token (`wrong_role`), or the lease is held by an executor of another "
                            "token (`not_your_lease`)."}
    return {
        "/api/v1/health": {"get": {
            "operationId": "health",
            "tags": ["health"],
            "summary": "Whether the API is up and reaches its database",
            "security": [],
            "responses": _responses(_ok(_ref("Health"), "Up, and the database answers."),
                                    {"503": {"$ref": "#/components/responses/DatabaseUnavailable"}}),
        }},
        "/api/v1/meta": {"get": {
            "operationId": "meta",
            "tags": ["meta"],
            "summary": "The task kinds (params, default subtask sizes) and the task statuses",
            "responses": _responses(_ok(_ref("Meta"), "What this server knows."), _AUTHED),
        }},
        "/api/v1/tasks": {
            "post": {
                "operationId": "submitTask",
                "tags": ["tasks"],
                "summary": "Submit a task",
                "description": "Idempotent: the same body again answers 200 with the existing task; a different "
                               "body under an existing (team, project, name) is a 409. With `dry_run=true`, "
                               "every check and nothing created: 200 `{\"valid\": true}`.",
                "parameters": [
                    _query_param("dry_run", {"type": "string", "enum": ["true", "false", "1", "0"]},
                                 "Judge the body (fields, records, the team's scope, the priority cap) and create "
                                 "nothing; `submit --replace` asks it before deleting the task it replaces."),
                ],
                "requestBody": _json_body(_ref("TaskRequest"), "The task."),
                "responses": _responses(
                    _ok(_ref("Task"), "Submitted (status `submitted`).", "201"),
                    _ok({"oneOf": [_ref("Task"), {"type": "object", "required": ["valid"],
                                                   "properties": {"valid": {"type": "boolean", "enum": [True]}}}]},
                        "The same task was submitted before: that task; or, with `dry_run=true`, the body "
                        "passed every check (`{\"valid\": true}`)."),
                    _AUTHED, _BODY,
                    e403="Not a user token (`wrong_role`), or one scoped to another team (`wrong_team`), or "
                         "an `input.uri` the task's team may not read (`input_not_allowed`): a task reads only "
                         "its team's uploads and inline inputs, or s3:// prefixes an operator allowed for the "
                         "team (`minions team allow-input`); or a user's `priority` above the team's priority "
                         "cap (`priority_above_cap`, the cap in the message); or a user's task for a team that "
                         "does not exist (`unknown_team`: only an admin makes a team); nothing is created.",
                    e409="A different task of that name exists (`task_exists`); the message says what to do: "
                         "another name, a retry of a failed one, or delete it (what `minions submit "
                         "--replace` does) and submit again.",
                    e422="Invalid values, each named in `fields`.",
                ),
            },
            "get": {
                "operationId": "listTasks",
                "tags": ["tasks"],
                "summary": "List tasks, newest first",
                "parameters": [
                    _query_param("team", _name("team"), "Only this team's tasks."),
                    _query_param("project", _name("project"), "Only this project's tasks."),
                    _query_param("status", {"type": "string", "enum": list(TASK_STATUSES)},
                                 "Only tasks in this status."),
                    _query_param("limit", _int(1, 500), "Page size (default 50)."),
                    _query_param("cursor", _int(0, 2**63 - 1), "The `next` of the previous page (a task id)."),
                    _query_param("interactive", {"type": "string", "enum": ["false", "true", "all"]},
                                 "The OpenAI interactive lane's requests (a task each): left out (`false`, the "
                                 "default), only them (`true`), or both (`all`)."),
                ],
                "responses": _responses(_ok(_ref("TaskList"), "A page of tasks."), _AUTHED,
                                        e403="Not a user token (`wrong_role`).",
                                        e422="Invalid filters, limit or cursor."),
            },
        },
        "/api/v1/tasks/{team}/{project}/{name}": {
            "parameters": _TASK_PATH,
            "get": {
                "operationId": "getTask",
                "tags": ["tasks"],
                "summary": "A task and its progress",
                "responses": _responses(_ok(_ref("Task"), "The task."), _AUTHED, **task_errors),
            },
            "delete": {
                "operationId": "deleteTask",
                "tags": ["tasks"],
                "summary": "Delete a finished task",
                "description": "The task and its subtasks go; its input and result objects become garbage, "
                               "deleted by the garbage collector after `MINIONS_GC_GRACE_S` (which gives the "
                               "team's input quota its bytes back).",
                "responses": _responses(_ok(_ref("Ok"), "Deleted."), _AUTHED, **task_errors,
                                        e409="The task has not ended (`not_finished`): cancel it first."),
            },
        },
        "/api/v1/tasks/{team}/{project}/{name}/cancel": {
            "parameters": _TASK_PATH,
            "post": {
                "operationId": "cancelTask",
                "tags": ["tasks"],
                "summary": "Cancel a task",
                "description": "Pending subtasks are cancelled; leased ones are refused at their next heartbeat "
                               "or completion. Cancelling a cancelled task answers 200 again.",
                "responses": _responses(_ok(_ref("Task"), "The task, cancelled."), _AUTHED, **task_errors,
                                        e409="The task already completed or failed (`task_finished`)."),
            },
        },
        "/api/v1/tasks/{team}/{project}/{name}/retry": {
            "parameters": _TASK_PATH,
            "post": {
                "operationId": "retryTask",
                "tags": ["tasks"],
                "summary": "Run a failed task's failed subtasks again",
                "description": "Its failed subtasks go back to the queue, each with a fresh budget of the "
                               "task's `max_attempts`; its committed results stay. The task is `running` again "
                               "(`queued` if nothing of it was ever claimed) until it ends anew.",
                "responses": _responses(_ok(_ref("Task"), "The task, running again."), _AUTHED, **task_errors,
                                        e409="The task is not failed (`task_not_failed`), or failed with no "
                                             "failed subtask, its input unsplittable (`nothing_to_retry`)."),
            },
        },
        "/api/v1/tasks/{team}/{project}/{name}/verify": {
            "parameters": _TASK_PATH,
            "post": {
                "operationId": "verifyTask",
                "tags": ["tasks"],
                "summary": "Run a finished task's suspect results again, as a task of their own",
                "description": "The subtasks whose committed result came from an executor quarantined since "
                               "(every done subtask with `all`) run again as a new task in the same team and "
                               "project: the same input ranges, kind, params and model (pinned to the "
                               "revision the task named, else by its first lease). Compare its results with "
                               "the task's by record id (`minions verify` does).",
                "requestBody": _json_body({"type": "object", "additionalProperties": False, "properties": {
                    "all": {"type": "boolean", "default": False, "description": "Every done subtask."},
                    "name": _name("verification task's name (default: `<name>-verify-<6 hex>`)"),
                }}, "What to run again (an empty body: only the quarantined executors' results).",
                    required=False),
                "responses": _responses(
                    {"201": {"description": "The verification task and how many subtasks it runs.",
                             "content": {JSON: {"schema": _object({"task": _ref("Task"),
                                                                   "subtasks": {"type": "integer"}})}}}},
                    _ok(_object({"task": {"type": "object", "nullable": True, "enum": [None]},
                                 "subtasks": {"type": "integer", "enum": [0]}}), "Nothing to verify."),
                    _AUTHED, **task_errors,
                    e400="The body is not a JSON object.",
                    e409="The task has not ended (`task_not_finished`), or the name is taken (`task_exists`).",
                    e422="Unknown fields, `all` not a boolean, or `name` not a name."),
            },
        },
        "/api/v1/tasks/{team}/{project}/{name}/subtasks": {
            "parameters": _TASK_PATH,
            "get": {
                "operationId": "taskSubtasks",
                "tags": ["tasks"],
                "summary": "A page of a task's subtasks, in input order, with their attempts",
                "description": "For the web UI and operators. A lease in progress shows in `history` with "
                               "`\"outcome\": \"running\"`.",
                "parameters": [
                    _query_param("after", _int(0, 2**31 - 1), "The `next` of the previous page (a subtask id)."),
                    _query_param("limit", _int(1, 1000), "Page size (default 500)."),
                ],
                "responses": _responses(_ok(_ref("SubtaskPage"), "A page of subtasks."), _AUTHED, **task_errors,
                                        e422="Invalid `after` or `limit`."),
            },
        },
        "/api/v1/tasks/{team}/{project}/{name}/results": {
            "parameters": _TASK_PATH,
            "get": {
                "operationId": "taskResults",
                "tags": ["tasks"],
                "summary": "The results, one JSON line per input record, in input order",
                "parameters": [_query_param("partial", {"type": "string", "default": "false"},
                                            "`true` (or `1`, `yes`; any case) streams what is committed so far, "
                                            "before the task ends; any other value is false."),
                               _query_param("format", {"type": "string", "enum": ["jsonl", "npy", "parts"],
                                                       "default": "jsonl"},
                                            "`npy`: an embedding task's vectors as one NumPy array (float32, "
                                            "little-endian, one row per input record, NaN rows for records "
                                            "with no vector), once the task has ended. `parts`: a completed "
                                            "task's results as presigned GETs of a few large parts (JSON), "
                                            "whose concatenation is the JSONL stream.")],
                "responses": _responses(
                    {"200": {"description": "JSON lines: `{\"id\", \"embedding\"}`, `{\"id\", \"text\", \"usage\"}`, "
                                            "`{\"id\", \"slept_ms\"}`, or `{\"id\", \"error\"}`; "
                                            "with `format=npy`, a .npy file; with `format=parts`, the "
                                            "`ResultParts` listing.",
                             "content": {NDJSON: {"schema": {"type": "string"}},
                                         "application/octet-stream": {"schema": {"type": "string",
                                                                                 "format": "binary"}},
                                         JSON: {"schema": _ref("ResultParts")}}}},
                    _AUTHED, **task_errors,
                    e409="The task has not ended and `partial` was not asked for (`not_finished`); with "
                         "`format=npy`, also a task that is not `embedding` (`not_embedding`) or has no "
                         "vector (`no_vectors`), or a stored result among its first 1000 is not a vector "
                         "of the task's length (`malformed_result`: committed before complete checked "
                         "shapes; one past them breaks the response off).",
                    e422="`format` is not `jsonl`, `npy` or `parts`.",
                ),
            },
        },
        "/api/v1/inputs": {"post": {
            "operationId": "uploadInput",
            "tags": ["tasks"],
            "summary": "Store an input (JSONL) for a later submission",
            "description": "For clients with no object store of their own: submit the returned `uri` as "
                           "`input.uri`. The records are checked when the task is split. The upload belongs to "
                           "a team (`team`, else the token's team; an unscoped token naming none makes an upload "
                           "only unscoped tokens may submit), and only that team's tasks may read it. At most "
                           "`MINIONS_MAX_INPUT_BYTES` (default 2 GiB), within the team's quota of stored input "
                           "bytes (`MINIONS_TEAM_INPUT_QUOTA_BYTES`, default 20 GiB). An upload no task reads is "
                           "deleted after `MINIONS_GC_GRACE_S`. With `sha256` the input is stored under that "
                           "hash: the same bytes give the same `uri` (200 when the team already has them, "
                           "without writing them again).",
            "parameters": [_query_param("team", _name("team"), "The team the upload is for (default: the "
                                                               "token's team)."),
                           _query_param("sha256", {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                                        "The body's SHA-256 (lowercase hex): store it content-addressed; a body "
                                        "that does not match is refused (422) and nothing is stored.")],
            "requestBody": {"required": True, "description": "JSON lines, one input record per line.",
                            "content": {media_type: {"schema": {"type": "string", "minLength": 1}}
                                        for media_type in JSONL_MEDIA_TYPES}},
            "responses": _responses(
                _ok(_ref("InputUpload"), "Stored.", "201"),
                _ok(_ref("InputUpload"), "Already stored under this `sha256`: the same `uri`."), _AUTHED,
                e403="Not a user token (`wrong_role`), or a team the token is not scoped to (`wrong_team`).",
                e413="Over `MINIONS_MAX_INPUT_BYTES` (`too_large`) or the team's quota (`quota_exceeded`); the "
                     "limit is in the message and nothing is stored.",
                e415="The body is not JSONL (`unsupported_media_type`).",
                e422="The body is empty, `team` is not a valid name, or the body does not match `sha256`.",
            ),
        }},
        "/api/v1/executors": {"get": {
            "operationId": "listExecutors",
            "tags": ["executors"],
            "summary": "Executors and what they are doing",
            "parameters": [_query_param("team", _name("team"),
                                        "Executors that may work for this team (default: the token's team).")],
            "responses": _responses(_ok(_ref("ExecutorList"), "The executors."), _AUTHED,
                                    e403="Not a user token (`wrong_role`), or another team (`wrong_team`).",
                                    e422="Not a valid team name."),
        }},
        "/api/v1/usage": {"get": {
            "operationId": "getUsage",
            "tags": ["usage"],
            "summary": "Compute used per team, given per executor or owner",
            "description": "Every attempt that ended in the window, its compute-seconds charged to the team whose "
                           "task it ran and credited to the executor (and owner) that ran it; docs/API.md says "
                           "how each outcome counts.",
            "parameters": [
                _query_param("since", {"type": "string", "pattern": SINCE_PATTERN, "default": DEFAULT_SINCE},
                             f"The window back from now: {SINCE_RULE}."),
                _query_param("team", _name("team"), "Only this team's usage (default: the token's team; an "
                                                    "admin's: every team)."),
                _query_param("by", {"type": "string", "enum": list(USAGE_BY), "default": "team"},
                             "One row per team, per executor or per owner."),
            ],
            "responses": _responses(_ok(_ref("Usage"), "The usage, most compute first."), _AUTHED,
                                    e403="Not a user token (`wrong_role`), or another team (`wrong_team`).",
                                    e422="`since`, `by` or `team` breaks its rule (named in `fields`)."),
        }},
        "/api/v1/executors/register": {"post": {
            "operationId": "registerExecutor",
            "tags": ["executor protocol"],
            "summary": "Register an executor (or update it)",
            "requestBody": _json_body(_ref("ExecutorRegistration"), "The machine and what it serves."),
            "responses": _responses(
                _ok(_ref("Registered"), "Registered: its id and the protocol timings.", "201"), _AUTHED, _BODY,
                {"429": {**_error("The token registered `MINIONS_REGISTRATIONS_PER_MINUTE` new executor names in "
                                  "the last minute (`too_many_registrations`); retry after `Retry-After` seconds."),
                         "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1},
                                                     "required": True}}}},
                e403="Not an executor token (`wrong_role`), or the token holds "
                     "`MINIONS_MAX_EXECUTORS_PER_TOKEN` executor names already (`too_many_executors`).",
                e422="Invalid values, each named in `fields` (a `hardware` over 8,192 bytes of JSON among them)."),
        }},
        "/api/v1/executors/{executor_id}/claim": {
            "parameters": _EXECUTOR_ID,
            "post": {
                "operationId": "claim",
                "tags": ["executor protocol"],
                "summary": "Claim a subtask (long poll)",
                "description": "Preferences first, then priority and submission order; only kinds and models "
                               "the executor advertised.",
                "parameters": [
                    _query_param("wait", {"type": "number", "minimum": 0, "maximum": 86400},
                                 "Seconds to wait for work; cut to the server's long-poll limit."),
                    _query_param("max", {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                                 "Up to this many subtasks at once (cut to `MINIONS_MAX_CLAIM`), answered as a "
                                 "`LeaseBatch` with as many as are pending, never waiting once there is one. "
                                 "Absent: one, answered as a `Lease`."),
                    _query_param("params", {"type": "string", "enum": ["each", "once"], "default": "each"},
                                 "`once`: in a `LeaseBatch`, each task's params ride in its first lease only; the "
                                 "others carry `params_from`, that lease's index, and empty `params`."),
                ],
                "responses": _responses(
                    _ok({"oneOf": [_ref("Lease"), _ref("LeaseBatch")]},
                        "A lease on a subtask (without `max`), or a batch of them (with it)."),
                    {"204": {"description": "Nothing to do within `wait` seconds."}},
                    _AUTHED, **{**executor_errors, "e403": executor_errors["e403"] + " Or the executor is "
                                "quarantined (`quarantined`, with the reason): its results lost spot checks."},
                    e409="The executor deregistered (`deregistered`).",
                    e422="`wait` is not a number from 0 to 86400, `max` not a whole number from 1, or `params` "
                         "neither each nor once.",
                ),
            },
        },
        "/api/v1/executors/{executor_id}/heartbeat": {
            "parameters": _EXECUTOR_ID,
            "post": {
                "operationId": "heartbeat",
                "tags": ["executor protocol"],
                "summary": "Say the executor is alive, and learn the fate of its leases",
                "requestBody": _json_body(_ref("Heartbeat"), "The leases held (an empty body holds none).",
                                          required=False),
                "responses": _responses(_ok(_ref("HeartbeatReply"), "Each lease: ok, lost or cancelled; a fresh "
                                                                  "input URL for each lease renewed that reads "
                                                                  "its input by URL (`input_urls`)."),
                                        _AUTHED, _BODY, **executor_errors,
                                        e422="`leases` is not a list of at most 1000 strings."),
            },
        },
        "/api/v1/executors/{executor_id}/release": {
            "parameters": _EXECUTOR_ID,
            "post": {
                "operationId": "releaseExecutor",
                "tags": ["executors"],
                "summary": "Lift an executor's quarantine (admin)",
                "description": "It claims again, its results checked until it earns trust again.",
                "responses": _responses(_ok(_object({"executor_id": {"type": "string", "format": "uuid"},
                                                     "quarantined": {"type": "boolean"}}), "Released."),
                                        _AUTHED, e403="Not an admin token (`wrong_role`).",
                                        e409="Not quarantined, or no such executor (`not_quarantined`)."),
            },
        },
        "/api/v1/executors/{executor_id}/deregister": {
            "parameters": _EXECUTOR_ID,
            "post": {
                "operationId": "deregister",
                "tags": ["executor protocol"],
                "summary": "Go offline, releasing every lease",
                "responses": _responses(_ok(_ref("Deregistered"), "Offline."), _AUTHED, **executor_errors),
            },
        },
        "/api/v1/leases/{token}/complete": {
            "parameters": _LEASE_TOKEN,
            "post": {
                "operationId": "completeLease",
                "tags": ["executor protocol"],
                "summary": "Commit a subtask whose output was written",
                "description": "The output is verified first: one JSONL line per input record of the "
                               "subtask, with the input's ids in order, each of its kind's shape. A "
                               "verified copy is committed "
                               "(its SHA-256 recorded); the output URL stops working.",
                "requestBody": _json_body(_ref("Completion"), "What was done."),
                "responses": _responses(
                    _ok(_ref("Ok"), "Committed (or committed already by this lease: a retried complete)."),
                    _AUTHED, _BODY, **lease_errors,
                    e409="The lease is no longer current (`lease_lost`), its task was cancelled "
                         "(`task_cancelled`), or the output was not written (`output_missing`).",
                    e422="`records` is missing, negative, or not the subtask's record count (`invalid`); "
                         "or the output does not hold one line per record with the input's ids in order, "
                         "or a line breaks its kind's shape (API.md, Output object) or repeats a key "
                         "(`output_mismatch`, naming the line and the field: nothing committed, the lease "
                         "stays live).",
                ),
            },
        },
        "/api/v1/leases/{token}/fail": {
            "parameters": _LEASE_TOKEN,
            "post": {
                "operationId": "failLease",
                "tags": ["executor protocol"],
                "summary": "Report a failed attempt",
                "description": "A retryable failure requeues the subtask until its attempts run out.",
                "requestBody": _json_body(_ref("Failure"), "What went wrong."),
                "responses": _responses(
                    _ok(_ref("Ok"), "Recorded."), _AUTHED, _BODY, **lease_errors,
                    e409="The lease is no longer current (`lease_lost`) or its task was cancelled "
                         "(`task_cancelled`).",
                    e422="`error` is missing or blank, or `retryable` is not a boolean.",
                ),
            },
        },
        "/api/v1/leases/{token}/release": {
            "parameters": _LEASE_TOKEN,
            "post": {
                "operationId": "releaseLease",
                "tags": ["executor protocol"],
                "summary": "Hand a subtask back without counting an attempt",
                "responses": _responses(
                    _ok(_ref("Ok"), "Requeued."), _AUTHED, **lease_errors,
                    e409="The lease is no longer current (`lease_lost`) or its task was cancelled "
                         "(`task_cancelled`).",
                ),
            },
        },
        **_batched_lease_paths(lease_errors),
        "/api/v1/teams": {"get": {
            "operationId": "listTeamShares",
            "tags": ["teams"],
            "summary": "Each known team's share of the pool: weight, priority cap, lease cap",
            "description": "A team is known once a token, task or executor names it. An admin, or a user "
                           "scoped to no team, sees every known team; a team's user sees its own.",
            "responses": _responses(_ok(_ref("TeamShareList"), "The teams, by name."), _AUTHED,
                                    e403="Not a user token (`wrong_role`)."),
        }},
        "/api/v1/teams/{team}": {
            "parameters": [_path_param("team", _name("team"), "A known team.")],
            "patch": {
                "operationId": "setTeamShare",
                "tags": ["teams"],
                "summary": "Set a team's weight, priority cap or lease cap (admin)",
                "requestBody": _json_body(_ref("TeamShareChange"), "The values to change."),
                "responses": _responses(
                    _ok(_ref("TeamShare"), "The team's share as it is now."), _AUTHED, _BODY,
                    e403="Not an admin token (`wrong_role`).",
                    e422="A value breaks its rule, an unknown field or an empty body (`invalid`, each named in "
                         "`fields`); or no token, task or executor names the team (`unknown_team`): nothing "
                         "is changed.",
                ),
            },
        },
        # Last: a fuzzed revoke of a seeded token then cannot starve the operations above.
        "/api/v1/tokens": {
            "get": {
                "operationId": "listTokens",
                "tags": ["tokens"],
                "summary": "List tokens (never their secrets)",
                "parameters": [_query_param("status", {"type": "string", "enum": ["active", "expired", "revoked"]},
                                            "Only tokens in this state.")],
                "responses": _responses(_ok(_ref("TokenList"), "The tokens, oldest first."), _AUTHED,
                                        e403="Not an admin token (`wrong_role`).",
                                        e422="Not a known status."),
            },
            "post": {
                "operationId": "createToken",
                "tags": ["tokens"],
                "summary": "Create a token, optionally expiring",
                "requestBody": _json_body(_ref("TokenRequest"), "Its role, team scope, label and lifetime."),
                "responses": _responses(_ok(_ref("CreatedToken"), "Created; the secret is shown this once.", "201"),
                                        _AUTHED, _BODY, e403="Not an admin token (`wrong_role`).",
                                        e422="Invalid values, each named in `fields`."),
            },
        },
        "/api/v1/tokens/{token_id}/revoke": {
            "parameters": [_path_param("token_id", {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                                       "The token's id (`GET /api/v1/tokens`).")],
            "post": {
                "operationId": "revokeToken",
                "tags": ["tokens"],
                "summary": "Revoke a token: every API process refuses it within a second",
                "responses": _responses(
                    _ok(_ref("Token"), "Revoked (revoking a revoked token changes nothing)."), _AUTHED,
                    e403="Not an admin token (`wrong_role`).",
                    e404="No such token.",
                    e409="The token of this very request (`own_token`): revoke it with another admin token "
                         "or `minions token revoke`.",
                ),
            },
        },
    }


def _batched_lease_paths(lease_errors: dict[str, str]) -> dict[str, Schema]:
    """Complete, fail and release of many leases in one request: each lease answered on its own."""
    outcomes = _ok(_ref("BatchReply"), "Each lease's outcome, in the order sent: the HTTP status and error its own "
                                       "request would have had (200: done).")
    errors = {"e403": lease_errors["e403"].replace("or the lease is held", "per lease: or a lease held"),
              "e422": "The body is not the batch's shape, each fault named in `fields`."}
    return {
        f"/api/v1/leases/{step}": {"post": {
            "operationId": f"{step}Leases",
            "tags": ["executor protocol"],
            "summary": summary,
            "requestBody": _json_body(_ref(schema), "The leases, each as its own request would carry it."),
            "responses": _responses(outcomes, _AUTHED, _BODY, **errors),
        }}
        for step, schema, summary in (
            ("complete", "CompletionBatch", "Commit many subtasks (outputs written, or inline)"),
            ("fail", "FailureBatch", "Report many failed attempts"),
            ("release", "ReleaseBatch", "Hand many subtasks back without counting attempts"),
        )
    }


def _with_openai(paths: dict[str, Schema]) -> dict[str, Schema]:
    """The /v1 operations placed before the token operations, which stay last (see _paths)."""
    tokens = {path: item for path, item in paths.items() if path.startswith("/api/v1/tokens")}
    rest = {path: item for path, item in paths.items() if path not in tokens}
    return {**rest, **openai_document.paths(), **tokens}


def document(server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.0.3 document of the API; `server_url` (e.g. "http://127.0.0.1:8080") becomes its
    server, otherwise paths are relative to wherever the document was fetched from."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "Minions API", "version": "1", "description": DESCRIPTION},
        "servers": [{"url": server_url.rstrip("/") if server_url else "/"}],
        "tags": [
            {"name": "tasks", "description": "Submitting tasks and reading their results (users)."},
            {"name": "executors", "description": "What the executors are doing (users)."},
            {"name": "executor protocol", "description": "Register, claim, heartbeat, commit (agents)."},
            {"name": "teams", "description": "Teams' shares of the pool (set by admins)."},
            {"name": "tokens", "description": "Token lifecycle (admins)."},
            {"name": "usage", "description": "Compute used per team and given per executor and owner."},
            {"name": "health", "description": "Liveness, for load balancers."},
            {"name": "meta", "description": "The kinds and statuses this server knows (any token)."},
            {"name": openai_document.TAG, "description": "OpenAI's API under /v1 (docs/OPENAI.md)."},
        ],
        "security": [{"bearerAuth": []}],
        "paths": _with_openai(_paths()),
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer",
                               "description": "An API token (`minions token create`)."},
            },
            # The executor protocol's messages: generated from their one definition (minions/protocol.py).
            "schemas": {**_request_schemas(), **_response_schemas(), **protocol.openapi_schemas(),
                        **openai_document.schemas()},
            "responses": {
                "Unauthorized": {
                    **_error("No bearer token, or an unknown or revoked one (`unauthorized`)."),
                    "headers": {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True}},
                },
                "DatabaseUnavailable": {
                    **_error("The database is unreachable (`database_unavailable`); retry after `Retry-After` "
                             "seconds."),
                    "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 0}, "required": True}},
                },
                "MalformedBody": _error("The body is not a JSON object (`malformed_json`, `malformed_body`), or "
                                        "is nested more than 64 levels deep (`too_deep`)."),
                "RequestTimeout": _error("The body stopped arriving (`request_timeout`): slower than "
                                         "`MINIONS_BODY_MIN_RATE` after `MINIONS_BODY_TIMEOUT_S`."),
                "TooLarge": _error("The body is over the server's limit (`too_large`); upload large inputs with "
                                   "`POST /api/v1/inputs`. Inline records over the team's quota of stored input "
                                   "bytes: `quota_exceeded`."),
            },
        },
    }
