"""What several resources' parts of the /api/v1 document share (tasks/openapi.py, leasing/openapi.py, …):
schema builders, the operation and path-item builders every part writes its operations with, the path
parameters and error groups of more than one resource, and the shared components (the Error schema, the
middlewares' responses, the bearer scheme). parts.py holds what the /v1 document shares too."""

from __future__ import annotations

from typing import Any

from minions.names import NAME_PATTERN
from minions.services.api.openapi.parts import JSON, Schema
from minions.services.api.openapi.parts import error as _error

NDJSON = "application/x-ndjson"
# Stored text cannot hold U+0000 (PostgreSQL): the server refuses it with 422 in these fields.
NO_NUL = r"^[^\u0000]*$"
NOT_BLANK_NO_NUL = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


def name(description: str) -> Schema:
    return {"type": "string", "pattern": NAME_PATTERN, "minLength": 1, "maxLength": 64,
            "description": description}


def integer(low: int, high: int, description: str | None = None) -> Schema:
    schema: Schema = {"type": "integer", "minimum": low, "maximum": high}
    if description:
        schema["description"] = description
    return schema


def nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


def json_body(schema: Schema, description: str, *, required: bool = True) -> Schema:
    return {"required": required, "description": description, "content": {JSON: {"schema": schema}}}


def object_schema(properties: Schema, required: list[str] | None = None, **extra: Any) -> Schema:
    return {"type": "object", "required": required if required is not None else list(properties),
            "properties": properties, **extra}


def timestamp(nullable: bool = False) -> Schema:
    schema: Schema = {"type": "string", "format": "date-time"}
    return {**schema, "nullable": True} if nullable else schema


def operation(operation_id: str, tag: str, summary: str, *, responses: dict[str, Schema],
              security: list[Schema] | None = None, description: str | None = None,
              parameters: list[Schema] | None = None, request_body: Schema | None = None) -> Schema:
    """One operation: what is particular to it, its keys in the one order every operation of the
    document has always had (the served bytes stay the same)."""
    schema: Schema = {"operationId": operation_id, "tags": [tag], "summary": summary}
    # `security=[]` (no token needed) is kept: only an absent one inherits the document's.
    optional = {"security": security, "description": description, "parameters": parameters,
                "requestBody": request_body}
    schema.update((key, value) for key, value in optional.items() if value is not None)
    schema["responses"] = responses
    return schema


def path_item(parameters: list[Schema] | None = None, **operations: Schema) -> Schema:
    """A path's operations (`get=operation(...)`, in the order given), after the path parameters
    they share, if any."""
    return {"parameters": parameters, **operations} if parameters is not None else operations


# Errors that the middlewares can give any operation that needs a token.
AUTHED = {
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "503": {"$ref": "#/components/responses/DatabaseUnavailable"},
}
BODY = {  # operations that read a JSON body
    "400": {"$ref": "#/components/responses/MalformedBody"},
    "408": {"$ref": "#/components/responses/RequestTimeout"},
    "413": {"$ref": "#/components/responses/TooLarge"},
}


def path_param(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}


def query_param(name: str, schema: Schema, description: str) -> Schema:
    # The server reads an empty value (`?team=`) as an absent one.
    return {"name": name, "in": "query", "required": False, "allowEmptyValue": True, "schema": schema,
            "description": description}


# A task's operations (tasks/openapi.py) and its results (results/openapi.py).
TASK_PATH = [
    path_param("team", name("team"), "The task's team."),
    path_param("project", name("project"), "The task's project."),
    path_param("name", name("task name"), "The task's name."),
]
TASK_ERRORS = {"e403": "The token's role is not `user` (`wrong_role`).",
               "e404": "No such task, or one of a team the token cannot see."}
# An executor's operations (executors/openapi.py) and its claim and heartbeat (leasing/openapi.py).
EXECUTOR_ID = [path_param("executor_id", {"type": "string", "format": "uuid"},
                          "The id `POST /api/v1/executors/register` returned.")]
EXECUTOR_ERRORS = {"e403": "Not an executor token (`wrong_role`), or the executor was registered with "
                           "another token (`not_your_executor`).",
                   "e404": "No such executor."}


def schemas() -> dict[str, Schema]:
    """The one error shape every operation answers with."""
    return {
        "Error": object_schema({
            "error": object_schema({
                "code": {"type": "string", "description": "Machine-readable, e.g. `not_found`, `lease_lost`."},
                "message": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": {"type": "string"},
                           "description": "For 422: what is wrong with each field."},
                "type": {"type": "string", "description": "OpenAI's error type, on /v1's `model_not_found`."},
                "param": {"type": "string", "nullable": True,
                          "description": "OpenAI's parameter at fault, on /v1's `model_not_found`."},
            }, required=["code", "message"]),
        }),
    }


def security_schemes() -> dict[str, Schema]:
    return {
        "bearerAuth": {"type": "http", "scheme": "bearer",
                       "description": "An API token (`minions token create`)."},
    }


def middleware_responses() -> dict[str, Schema]:
    """The responses AUTHED and BODY refer to."""
    return {
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
    }
