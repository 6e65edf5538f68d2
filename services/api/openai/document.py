"""The /v1 operations in the API's OpenAPI document (services/api/openapi/document.py merges them in): OpenAI's
shapes as this server takes and answers them, so that tests/fuzz holds /v1 to them like the rest.

Request schemas are the server's own checks (translate.py, batches.py, files.py, bounds.py):
`additionalProperties: false` where unknown fields are refused (`unsupported_parameter`), `{}` for
fields the server accepts and ignores. Errors share the API's one shape (`#/components/schemas/Error`).
"""

from __future__ import annotations

from typing import Any

from minions.kinds import PARAMS
from minions.services.api.openai.batches import MAX_BODY_BYTES
from minions.services.api.openai.bounds import MAX_INPUTS
from minions.services.api.openai.files import PURPOSES
from minions.services.api.openai.translate import ENDPOINT_KIND, ROLE_MAP
from minions.services.api.openapi.parts import JSON, Schema
from minions.services.api.openapi.parts import error as _error
from minions.services.api.openapi.parts import ok as _ok
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses

JSONL = "application/jsonl"
NO_NUL = r"^[^\u0000]*$"
BATCH_STATUSES = ["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                  "cancelled"]
TAG = "openai"


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def _object(properties: Schema, required: list[str] | None = None, **extra: Any) -> Schema:
    return {"type": "object", "required": list(properties) if required is None else required,
            "properties": properties, **extra}


def _int(low: int, high: int) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": high}


_AUTHED = {"401": {"$ref": "#/components/responses/Unauthorized"},
           "403": _error("Not a user or admin token (`wrong_role`)."),
           "503": {"$ref": "#/components/responses/DatabaseUnavailable"}}
_BODY = {"400": {"$ref": "#/components/responses/MalformedBody"},
         "408": {"$ref": "#/components/responses/RequestTimeout"}}


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "query", "required": False, "allowEmptyValue": True, "schema": schema,
            "description": description}


def _path(name: str, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "description": description}


# ---------------------------------------------------------------- request schemas


def _model() -> Schema:
    return {"type": "string", "minLength": 1, "maxLength": 256, "pattern": NO_NUL,
            "description": "A model an executor serves (`GET /api/v1/executors`)."}


def _sampling() -> Schema:
    completion = PARAMS["completion"]
    max_tokens = _nullable(_int(int(completion["max_tokens"].minimum or 1), int(completion["max_tokens"].maximum or 1)))
    return {
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "max_tokens": max_tokens,
        "seed": _nullable(_int(int(completion["seed"].minimum or 0), int(completion["seed"].maximum or 0))),
        "n": {"type": "integer", "enum": [1]},
        "stream": {"type": "boolean", "enum": [False]},
        "user": {"description": "Accepted and ignored."},
    }


def _request_schemas() -> dict[str, Schema]:
    text_part = _object({"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}})
    message = _object({
        "role": {"type": "string", "enum": list(ROLE_MAP), "description": "`developer` is read as `system`."},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": text_part}],
                    "description": "A string, or text parts (joined); images and audio are refused."},
    })
    return {
        "OpenAIEmbeddingsRequest": _object({
            "model": _model(),
            "input": {"oneOf": [{"type": "string"},
                                {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": {"type": "string"}}],
                      "description": f"A text, or up to {MAX_INPUTS} (token arrays are refused)."},
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "user": {"description": "Accepted and ignored."},
        }, required=["model", "input"], additionalProperties=False),
        "OpenAIChatRequest": _object({
            "model": _model(),
            "messages": {"type": "array", "minItems": 1, "items": message},
            **_sampling(),
            "max_completion_tokens": _sampling()["max_tokens"],
            "store": {"description": "Accepted and ignored."},
            "metadata": {"description": "Accepted and ignored."},
        }, required=["model", "messages"], additionalProperties=False),
        "OpenAICompletionRequest": _object({
            "model": _model(),
            "prompt": {"oneOf": [{"type": "string"},
                                 {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string"}}],
                       "description": "One prompt."},
            **_sampling(),
        }, required=["model", "prompt"], additionalProperties=False),
        "OpenAIBatchRequest": _object({
            "input_file_id": {"type": "string", "pattern": NO_NUL, "description": "A file of purpose `batch`."},
            "endpoint": {"type": "string", "enum": list(ENDPOINT_KIND)},
            "completion_window": {"type": "string", "pattern": "^[0-9]{1,6}[hms]$",
                                  "description": "From 1s to 168h, e.g. `24h`."},
            "metadata": _nullable({"type": "object", "maxProperties": 16,
                                   "additionalProperties": {"type": "string", "maxLength": 512, "pattern": NO_NUL},
                                   "description": "Keys up to 64 characters; `project` (and `team`, for a token "
                                                  "scoped to none) name the task; `priority`, an integer from "
                                                  "-1000 to 1000 as a string, is its priority (a user's at most "
                                                  "the team's priority cap)."}),
        }, required=["input_file_id", "endpoint", "completion_window"], additionalProperties=False),
        "OpenAIFileUpload": _object({
            "purpose": {"type": "string", "enum": list(PURPOSES)},
            "file": {"type": "string", "format": "binary", "minLength": 1,
                     "description": "JSONL: one request per line (checked when a batch is created)."},
        }, additionalProperties=False),
    }


# ---------------------------------------------------------------- response schemas


def _usage(*names: str) -> Schema:
    return _object({name: {"type": "integer", "minimum": 0} for name in names})


def _response_schemas() -> dict[str, Schema]:
    stamp = {"type": "integer", "description": "Unix seconds."}
    line_error = _object({"code": {"type": "string"}, "message": {"type": "string"},
                          "param": _nullable({"type": "string"}), "line": _nullable({"type": "integer"})})
    return {
        "OpenAIFile": _object({
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["file"]},
            "bytes": {"type": "integer", "minimum": 0}, "created_at": stamp, "filename": {"type": "string"},
            "purpose": {"type": "string", "enum": [*PURPOSES, "batch_output"]},
            "status": {"type": "string", "enum": ["processed"]},
            "expires_at": _nullable({"type": "integer"}), "status_details": _nullable({"type": "string"}),
        }),
        "OpenAIFileList": _object({
            "object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": _ref("OpenAIFile")},
            "first_id": _nullable({"type": "string"}), "last_id": _nullable({"type": "string"}),
            "has_more": {"type": "boolean"},
        }),
        "OpenAIFileDeleted": _object({"id": {"type": "string"}, "object": {"type": "string", "enum": ["file"]},
                                      "deleted": {"type": "boolean", "enum": [True]}}),
        "OpenAIBatch": _object({
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["batch"]},
            "endpoint": {"type": "string", "enum": list(ENDPOINT_KIND)},
            "errors": _nullable(_object({"object": {"type": "string", "enum": ["list"]},
                                         "data": {"type": "array", "items": line_error}})),
            "input_file_id": {"type": "string"}, "completion_window": {"type": "string"},
            "status": {"type": "string", "enum": BATCH_STATUSES},
            "output_file_id": _nullable({"type": "string"}), "error_file_id": _nullable({"type": "string"}),
            "created_at": stamp, "in_progress_at": _nullable(stamp), "expires_at": stamp,
            **{f"{step}_at": _nullable(stamp)
               for step in ("finalizing", "completed", "failed", "expired", "cancelling", "cancelled")},
            "request_counts": _usage("total", "completed", "failed"),
            "metadata": _nullable({"type": "object", "additionalProperties": {"type": "string"}}),
        }),
        "OpenAIBatchList": _object({
            "object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": _ref("OpenAIBatch")},
            "first_id": _nullable({"type": "string"}), "last_id": _nullable({"type": "string"}),
            "has_more": {"type": "boolean"},
        }),
        "OpenAIModel": _object({
            "id": {"type": "string", "description": "The model's name, as tasks and requests give it."},
            "object": {"type": "string", "enum": ["model"]},
            "created": {**stamp, "description": "When an executor first advertised it (Unix seconds)."},
            "owned_by": {"type": "string", "enum": ["minions"]},
            "kinds": {"type": "array", "items": {"type": "string"},
                      "description": "The kinds it was advertised for (`embedding`, `completion`)."},
            "online": {"type": "boolean", "description": "Whether an executor online now serves it."},
        }),
        "OpenAIModelList": _object({
            "object": {"type": "string", "enum": ["list"]}, "data": {"type": "array", "items": _ref("OpenAIModel")},
        }),
        "OpenAIEmbeddings": _object({
            "object": {"type": "string", "enum": ["list"]},
            "data": {"type": "array", "items": _object({
                "object": {"type": "string", "enum": ["embedding"]}, "index": {"type": "integer", "minimum": 0},
                "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}],
                              "description": "Floats, or little-endian float32 in base64 (`encoding_format`)."}})},
            "model": {"type": "string"}, "usage": _usage("prompt_tokens", "total_tokens"),
        }),
        "OpenAIChatCompletion": _object({
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["chat.completion"]}, "created": stamp,
            "model": {"type": "string"},
            "choices": {"type": "array", "items": _object({
                "index": {"type": "integer"},
                "message": _object({"role": {"type": "string", "enum": ["assistant"]}, "content": {"type": "string"},
                                    "refusal": _nullable({"type": "string"})}),
                "logprobs": _nullable({"type": "object"}),
                "finish_reason": {"type": "string", "enum": ["stop", "length"]}})},
            "usage": _usage("prompt_tokens", "completion_tokens", "total_tokens"),
            "system_fingerprint": _nullable({"type": "string"}),
        }),
        "OpenAICompletion": _object({
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["text_completion"]}, "created": stamp,
            "model": {"type": "string"},
            "choices": {"type": "array", "items": _object({
                "index": {"type": "integer"}, "text": {"type": "string"}, "logprobs": _nullable({"type": "object"}),
                "finish_reason": {"type": "string", "enum": ["stop", "length"]}})},
            "usage": _usage("prompt_tokens", "completion_tokens", "total_tokens"),
            "system_fingerprint": _nullable({"type": "string"}),
        }),
    }


def schemas() -> dict[str, Schema]:
    return {**_request_schemas(), **_response_schemas()}


# ---------------------------------------------------------------- operations


MODEL_NOT_FOUND = ("No executor ever advertised the model (`model_not_found`, with OpenAI's `type` "
                   "`invalid_request_error` and `param` `model` beside `code` and `message`).")


def _interactive(endpoint: str, operation_id: str, request: str, response: str, summary: str) -> Schema:
    return {"post": {
        "operationId": operation_id,
        "tags": [TAG],
        "summary": summary,
        "description": "Answered synchronously by an executor serving the model (docs/OPENAI.md, \"The "
                       "interactive lane\"). The body is bounded before it is decoded: "
                       "`MINIONS_OPENAI_MAX_REQUEST_BYTES` (default 4 MiB), 100,000 JSON values"
                       + (f", {MAX_INPUTS} inputs." if endpoint == "/v1/embeddings" else "."),
        "requestBody": {"required": True, "content": {JSON: {"schema": _ref(request)}}},
        "responses": _responses(
            _ok(_ref(response), "OpenAI's response."), _AUTHED, _BODY,
            e404=MODEL_NOT_FOUND,
            e413="Over `MINIONS_OPENAI_MAX_REQUEST_BYTES` (`too_large`, the limit in the message).",
            e422="A field the server refuses (each named in `fields`), an unsupported parameter, or more "
                 "inputs or JSON values than allowed.",
            e502="The executor failed the request after every attempt (`executor_failed`), or its stored "
                 "result breaks its kind's shape (`malformed_result`).",
            e504="No executor answered within 300 s (`timeout`); the request is cancelled.",
        ) | {"503": {**_error("No executor serving the model (a known one: GET /v1/models) is online now "
                              "(`no_executor`), or the database is unreachable (`database_unavailable`); retry "
                              "after `Retry-After` seconds."),
                     "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 0}, "required": True}}}},
    }}


def paths() -> dict[str, Schema]:
    file_id = [_path("file_id", "A file's id (`file-…`).")]
    batch_id = [_path("batch_id", "A batch's id (`batch_…`).")]
    not_found_file = "No such file (or another team's, or deleted)."
    return {
        "/v1/batches": {
            "post": {
                "operationId": "createOpenAIBatch",
                "tags": [TAG],
                "summary": "Create a batch: its input file checked and made a task",
                "description": "Validation happens here: the batch comes back `in_progress`, or `failed` with "
                               "each bad line in `errors` (docs/OPENAI.md).",
                "requestBody": {"required": True, "content": {JSON: {"schema": _ref("OpenAIBatchRequest")}}},
                "responses": _responses(
                    _ok(_ref("OpenAIBatch"), "The batch, in progress or failed validation."), _AUTHED, _BODY,
                    e403="Not a user token (`wrong_role`), or a user's `metadata.priority` above its team's "
                         "priority cap (`priority_above_cap`, the cap in the message): nothing is created.",
                    e404=f"`input_file_id`: {not_found_file}",
                    e413=f"A body over {MAX_BODY_BYTES:,} bytes (`too_large`).",
                    e422="Invalid values, each named in `fields` (a window past 168h, metadata that does not "
                         "name a valid team or project or a `priority` from -1000 to 1000, a file that is not "
                         "of purpose `batch`).",
                ),
            },
            "get": {
                "operationId": "listOpenAIBatches",
                "tags": [TAG],
                "summary": "Batches, newest first",
                "parameters": [_query("after", {"type": "string", "pattern": NO_NUL}, "A batch id: the page after it."),
                               _query("limit", _int(1, 100), "At most this many (default 20).")],
                "responses": _responses(_ok(_ref("OpenAIBatchList"), "A page of batches."), _AUTHED,
                                        e422="`limit` is not a whole number from 1 to 100, or `after` holds NUL."),
            },
        },
        "/v1/batches/{batch_id}": {"parameters": batch_id, "get": {
            "operationId": "getOpenAIBatch",
            "tags": [TAG],
            "summary": "A batch (finalized on read once its task has ended)",
            "responses": _responses(_ok(_ref("OpenAIBatch"), "The batch."), _AUTHED, e404="No such batch."),
        }},
        "/v1/batches/{batch_id}/cancel": {"parameters": batch_id, "post": {
            "operationId": "cancelOpenAIBatch",
            "tags": [TAG],
            "summary": "Cancel a batch: `cancelling`, then `cancelled` with its finished part delivered",
            "responses": _responses(_ok(_ref("OpenAIBatch"), "The batch."), _AUTHED, e404="No such batch.",
                                    e409="The batch has ended (`batch_finished`)."),
        }},
        "/v1/models": {"get": {
            "operationId": "listOpenAIModels",
            "tags": [TAG],
            "summary": "The models the pool knows: every model an executor has advertised, online now or not",
            "responses": _responses(_ok(_ref("OpenAIModelList"), "The models, by name."), _AUTHED),
        }},
        "/v1/models/{model}": {"parameters": [_path("model", "A model's name; its '/' sent as is or as %2F.")],
                               "get": {
            "operationId": "getOpenAIModel",
            "tags": [TAG],
            "summary": "A model the pool knows",
            "responses": _responses(_ok(_ref("OpenAIModel"), "The model."), _AUTHED, e404=MODEL_NOT_FOUND),
        }},
        "/v1/embeddings": _interactive("/v1/embeddings", "createOpenAIEmbeddings", "OpenAIEmbeddingsRequest",
                                       "OpenAIEmbeddings", "Embeddings, answered synchronously"),
        "/v1/chat/completions": _interactive("/v1/chat/completions", "createOpenAIChatCompletion",
                                             "OpenAIChatRequest", "OpenAIChatCompletion",
                                             "A chat completion, answered synchronously"),
        "/v1/completions": _interactive("/v1/completions", "createOpenAICompletion", "OpenAICompletionRequest",
                                        "OpenAICompletion", "A text completion, answered synchronously"),
        "/v1/files": {
            "get": {
                "operationId": "listOpenAIFiles",
                "tags": [TAG],
                "summary": "Files, newest first",
                "parameters": [_query("purpose", {"type": "string", "pattern": NO_NUL}, "Only files of this purpose."),
                               _query("after", {"type": "string", "pattern": NO_NUL}, "A file id: the page after it."),
                               _query("limit", _int(1, 10000), "At most this many (default 10000).")],
                "responses": _responses(_ok(_ref("OpenAIFileList"), "A page of files."), _AUTHED,
                                        e422="`limit` is not a whole number from 1 to 10000, or `purpose` or "
                                             "`after` holds NUL."),
            },
            "post": {
                "operationId": "uploadOpenAIFile",
                "tags": [TAG],
                "summary": "Upload a file (streamed to the store)",
                "description": "Within `MINIONS_MAX_INPUT_BYTES` and the team's input quota "
                               "(`MINIONS_TEAM_INPUT_QUOTA_BYTES`, shared with `POST /api/v1/inputs`), counted "
                               "as it streams: nothing over a limit is stored. Deleting the file gives the room "
                               "back.",
                "requestBody": {"required": True,
                                "content": {"multipart/form-data": {"schema": _ref("OpenAIFileUpload")}}},
                "responses": _responses(
                    _ok(_ref("OpenAIFile"), "Stored."), _AUTHED,
                    {"408": {"$ref": "#/components/responses/RequestTimeout"}},
                    e400="A multipart body that cannot be read (`malformed_body`: no boundary, a broken part).",
                    e413="Over `MINIONS_MAX_INPUT_BYTES` (`too_large`) or the team's quota (`quota_exceeded`); "
                         "the limit is in the message and nothing is stored.",
                    e415="Not `multipart/form-data` (`unsupported_media_type`).",
                    e422="`purpose` is not `batch`, `file` is missing, empty or sent twice, or another field "
                         "is sent (refused, not ignored).",
                ),
            },
        },
        "/v1/files/{file_id}/content": {"parameters": file_id, "get": {
            "operationId": "getOpenAIFileContent",
            "tags": [TAG],
            "summary": "A file's bytes, streamed",
            "responses": _responses(
                {"200": {"description": "The bytes.", "content": {JSONL: {"schema": {"type": "string"}}}}},
                _AUTHED, e404=not_found_file),
        }},
        "/v1/files/{file_id}": {
            "parameters": file_id,
            "get": {
                "operationId": "getOpenAIFile",
                "tags": [TAG],
                "summary": "A file",
                "responses": _responses(_ok(_ref("OpenAIFile"), "The file."), _AUTHED, e404=not_found_file),
            },
            # Last of /v1: a fuzzed delete of the seeded file then cannot starve the operations above.
            "delete": {
                "operationId": "deleteOpenAIFile",
                "tags": [TAG],
                "summary": "Delete a file (its bytes go back to the team's quota)",
                "responses": _responses(_ok(_ref("OpenAIFileDeleted"), "Deleted."), _AUTHED, e404=not_found_file),
            },
        },
    }
