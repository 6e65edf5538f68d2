"""The OpenAPI 3.0.3 description of the client API (API.md), built as a plain dict.

It mirrors what the server really does: request schemas are the checks of `validation.py` (a task's
fields: minions/task_fields.py) and the route modules (`additionalProperties: false` only where the
server refuses unknown fields), and each operation lists the statuses its handler and the
middlewares can answer. The schemathesis suite in tests/fuzz holds the server to it, and
tests/api/test_openapi.py keeps it and the router in step.

Each resource describes its own operations and schemas beside its routes (tasks/openapi.py,
leasing/openapi.py, …; what several share: components.py); this module only assembles them.
"""

from __future__ import annotations

from typing import Any

from minions import protocol
from minions.services.api.admin import openapi as admin
from minions.services.api.executors import openapi as executors
from minions.services.api.inputs import openapi as inputs
from minions.services.api.inputs.openapi import JSONL_MEDIA_TYPES
from minions.services.api.leasing import openapi as leasing
from minions.services.api.meta import openapi as meta
from minions.services.api.openai import document as openai_document
from minions.services.api.openapi import components
from minions.services.api.openapi.parts import Schema
from minions.services.api.results import openapi as results
from minions.services.api.tasks import openapi as tasks

__all__ = ["DESCRIPTION", "JSONL_MEDIA_TYPES", "document"]

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


def _tags() -> list[Schema]:
    return [
        {"name": "tasks", "description": "Submitting tasks and reading their results (users)."},
        {"name": "executors", "description": "What the executors are doing (users)."},
        {"name": "executor protocol", "description": "Register, claim, heartbeat, commit (agents)."},
        {"name": "teams", "description": "Teams' shares of the pool (set by admins)."},
        {"name": "tokens", "description": "Token lifecycle (admins)."},
        {"name": "usage", "description": "Compute used per team and given per executor and owner."},
        {"name": "health", "description": "Liveness, for load balancers."},
        {"name": "meta", "description": "The kinds and statuses this server knows (any token)."},
        {"name": openai_document.TAG, "description": "OpenAI's API under /v1 (docs/OPENAI.md)."},
    ]


def _paths() -> dict[str, Schema]:
    # The order is the document's, which the fuzzers in tests/fuzz walk: resources interleave where
    # the document always listed them so.
    return {
        **meta.paths(),
        **tasks.paths(),
        **results.paths(),
        **inputs.paths(),
        **executors.list_path(),
        **admin.usage_path(),
        **executors.register_path(),
        **leasing.claim_and_heartbeat_paths(),
        **executors.release_and_deregister_paths(),
        **leasing.lease_paths(),
        **admin.team_paths(),
        **openai_document.paths(),
        # Last: a fuzzed revoke of a seeded token then cannot starve the operations above.
        **admin.token_paths(),
    }


def _schemas() -> dict[str, Schema]:
    # Request schemas first, then the answers, as the document always listed them.
    return {
        **tasks.request_schemas(),
        **admin.request_schemas(),
        **components.schemas(),
        **tasks.schemas(),
        **inputs.schemas(),
        **results.schemas(),
        **executors.schemas(),
        **admin.schemas(),
        **meta.schemas(),
        # The executor protocol's messages: generated from their one definition (minions/protocol.py).
        **protocol.openapi_schemas(),
        **openai_document.schemas(),
    }


def document(server_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.0.3 document of the API; `server_url` (e.g. "http://127.0.0.1:8080") becomes its
    server, otherwise paths are relative to wherever the document was fetched from."""
    return {
        "openapi": "3.0.3",
        "info": {"title": "Minions API", "version": "1", "description": DESCRIPTION},
        "servers": [{"url": server_url.rstrip("/") if server_url else "/"}],
        "tags": _tags(),
        "security": [{"bearerAuth": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": components.security_schemes(),
            "schemas": _schemas(),
            "responses": components.middleware_responses(),
        },
    }
