"""The OpenAPI part of routes.py: submitting, listing, showing, cancelling, retrying, verifying and
deleting tasks, and a task's subtasks; with the task request schemas (the checks of validation.py, a
task's fields: minions/task_fields.py) and the Task and Subtask answers. openapi/document.py assembles it."""

from __future__ import annotations

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
from minions.records import CHAT_ROLES, MAX_ID_LENGTH, MAX_SLEEP_MS
from minions.services.api.openapi.components import AUTHED as _AUTHED
from minions.services.api.openapi.components import BODY as _BODY
from minions.services.api.openapi.components import NO_NUL, NOT_BLANK_NO_NUL, operation, path_item
from minions.services.api.openapi.components import TASK_ERRORS as _TASK_ERRORS
from minions.services.api.openapi.components import TASK_PATH as _TASK_PATH
from minions.services.api.openapi.components import integer as _int
from minions.services.api.openapi.components import json_body as _json_body
from minions.services.api.openapi.components import name as _name
from minions.services.api.openapi.components import nullable as _nullable
from minions.services.api.openapi.components import object_schema as _object
from minions.services.api.openapi.components import query_param as _query_param
from minions.services.api.openapi.components import timestamp as _timestamp
from minions.services.api.openapi.parts import JSON, Schema
from minions.services.api.openapi.parts import ok as _ok
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses
from minions.task_fields import MAX_SUBTASK_SIZE, PLACEMENTS

# An attempt in a subtask's history: the lease in progress, or how an ended one ended.
HISTORY_OUTCOMES = [RUNNING_ATTEMPT, *ATTEMPT_OUTCOMES]

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


def request_schemas() -> dict[str, Schema]:
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
    }


# ---------------------------------------------------------------- response schemas


def _count() -> Schema:
    return {"type": "integer", "minimum": 0}


def _task_schema() -> Schema:
    return _object({
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
    })


def schemas() -> dict[str, Schema]:
    return {
        "Task": _task_schema(),
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
    }


# ---------------------------------------------------------------- operations


def paths() -> dict[str, Schema]:
    return {**_tasks_path(), **_task_paths(), **_verify_and_subtasks_paths()}


def _tasks_path() -> dict[str, Schema]:
    """Submitting a task, and the task list."""
    return {
        "/api/v1/tasks": path_item(
            post=operation(
                "submitTask", "tasks", "Submit a task",
                description="Idempotent: the same body again answers 200 with the existing task; a different "
                            "body under an existing (team, project, name) is a 409. With `dry_run=true`, "
                            "every check and nothing created: 200 `{\"valid\": true}`.",
                parameters=[
                    _query_param("dry_run", {"type": "string", "enum": ["true", "false", "1", "0"]},
                                 "Judge the body (fields, records, the team's scope, the priority cap) and create "
                                 "nothing; `submit --replace` asks it before deleting the task it replaces."),
                ],
                request_body=_json_body(_ref("TaskRequest"), "The task."),
                responses=_responses(
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
            ),
            get=operation(
                "listTasks", "tasks", "List tasks, newest first",
                parameters=[
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
                responses=_responses(_ok(_ref("TaskList"), "A page of tasks."), _AUTHED,
                                     e403="Not a user token (`wrong_role`).",
                                     e422="Invalid filters, limit or cursor."),
            ),
        ),
    }


def _task_paths() -> dict[str, Schema]:
    """One task: shown, deleted, cancelled, retried."""
    return {
        "/api/v1/tasks/{team}/{project}/{name}": path_item(
            _TASK_PATH,
            get=operation(
                "getTask", "tasks", "A task and its progress",
                responses=_responses(_ok(_ref("Task"), "The task."), _AUTHED, **_TASK_ERRORS),
            ),
            delete=operation(
                "deleteTask", "tasks", "Delete a finished task",
                description="The task and its subtasks go; its input and result objects become garbage, "
                            "deleted by the garbage collector after `MINIONS_GC_GRACE_S` (which gives the "
                            "team's input quota its bytes back).",
                responses=_responses(_ok(_ref("Ok"), "Deleted."), _AUTHED, **_TASK_ERRORS,
                                     e409="The task has not ended (`not_finished`): cancel it first."),
            ),
        ),
        "/api/v1/tasks/{team}/{project}/{name}/cancel": path_item(_TASK_PATH, post=operation(
            "cancelTask", "tasks", "Cancel a task",
            description="Pending subtasks are cancelled; leased ones are refused at their next heartbeat "
                        "or completion. Cancelling a cancelled task answers 200 again.",
            responses=_responses(_ok(_ref("Task"), "The task, cancelled."), _AUTHED, **_TASK_ERRORS,
                                 e409="The task already completed or failed (`task_finished`)."),
        )),
        "/api/v1/tasks/{team}/{project}/{name}/retry": path_item(_TASK_PATH, post=operation(
            "retryTask", "tasks", "Run a failed task's failed subtasks again",
            description="Its failed subtasks go back to the queue, each with a fresh budget of the "
                        "task's `max_attempts`; its committed results stay. The task is `running` again "
                        "(`queued` if nothing of it was ever claimed) until it ends anew.",
            responses=_responses(_ok(_ref("Task"), "The task, running again."), _AUTHED, **_TASK_ERRORS,
                                 e409="The task is not failed (`task_not_failed`), or failed with no "
                                      "failed subtask, its input unsplittable (`nothing_to_retry`)."),
        )),
    }


def _verify_and_subtasks_paths() -> dict[str, Schema]:
    return {
        "/api/v1/tasks/{team}/{project}/{name}/verify": path_item(_TASK_PATH, post=operation(
            "verifyTask", "tasks", "Run a finished task's suspect results again, as a task of their own",
            description="The subtasks whose committed result came from an executor quarantined since "
                        "(every done subtask with `all`) run again as a new task in the same team and "
                        "project: the same input ranges, kind, params and model (pinned to the "
                        "revision the task named, else by its first lease). Compare its results with "
                        "the task's by record id (`minions verify` does).",
            request_body=_json_body({"type": "object", "additionalProperties": False, "properties": {
                "all": {"type": "boolean", "default": False, "description": "Every done subtask."},
                "name": _name("verification task's name (default: `<name>-verify-<6 hex>`)"),
            }}, "What to run again (an empty body: only the quarantined executors' results).", required=False),
            responses=_responses(
                {"201": {"description": "The verification task and how many subtasks it runs.",
                         "content": {JSON: {"schema": _object({"task": _ref("Task"),
                                                               "subtasks": {"type": "integer"}})}}}},
                _ok(_object({"task": {"type": "object", "nullable": True, "enum": [None]},
                             "subtasks": {"type": "integer", "enum": [0]}}), "Nothing to verify."),
                _AUTHED, **_TASK_ERRORS,
                e400="The body is not a JSON object.",
                e409="The task has not ended (`task_not_finished`), or the name is taken (`task_exists`).",
                e422="Unknown fields, `all` not a boolean, or `name` not a name."),
        )),
        "/api/v1/tasks/{team}/{project}/{name}/subtasks": path_item(_TASK_PATH, get=operation(
            "taskSubtasks", "tasks", "A page of a task's subtasks, in input order, with their attempts",
            description="For the web UI and operators. A lease in progress shows in `history` with "
                        "`\"outcome\": \"running\"`.",
            parameters=[
                _query_param("after", _int(0, 2**31 - 1), "The `next` of the previous page (a subtask id)."),
                _query_param("limit", _int(1, 1000), "Page size (default 500)."),
            ],
            responses=_responses(_ok(_ref("SubtaskPage"), "A page of subtasks."), _AUTHED, **_TASK_ERRORS,
                                 e422="Invalid `after` or `limit`."),
        )),
    }
