"""The OpenAPI part of routes.py: `POST /api/v1/inputs` and its InputUpload answer. openapi/document.py
assembles it."""

from __future__ import annotations

from minions.services.api.openapi.components import AUTHED as _AUTHED
from minions.services.api.openapi.components import NDJSON, operation, path_item
from minions.services.api.openapi.components import name as _name
from minions.services.api.openapi.components import object_schema as _object
from minions.services.api.openapi.components import query_param as _query_param
from minions.services.api.openapi.parts import Schema
from minions.services.api.openapi.parts import ok as _ok
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses

JSONL_MEDIA_TYPES = (NDJSON, "application/jsonl", "application/json-lines")  # what POST /api/v1/inputs takes


def paths() -> dict[str, Schema]:
    return {
        "/api/v1/inputs": path_item(post=operation(
            "uploadInput", "tasks", "Store an input (JSONL) for a later submission",
            description="For clients with no object store of their own: submit the returned `uri` as "
                        "`input.uri`. The records are checked when the task is split. The upload belongs to "
                        "a team (`team`, else the token's team; an unscoped token naming none makes an upload "
                        "only unscoped tokens may submit), and only that team's tasks may read it. At most "
                        "`MINIONS_MAX_INPUT_BYTES` (default 2 GiB), within the team's quota of stored input "
                        "bytes (`MINIONS_TEAM_INPUT_QUOTA_BYTES`, default 20 GiB). An upload no task reads is "
                        "deleted after `MINIONS_GC_GRACE_S`. With `sha256` the input is stored under that "
                        "hash: the same bytes give the same `uri` (200 when the team already has them, "
                        "without writing them again).",
            parameters=[_query_param("team", _name("team"), "The team the upload is for (default: the "
                                                            "token's team)."),
                        _query_param("sha256", {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                                     "The body's SHA-256 (lowercase hex): store it content-addressed; a body "
                                     "that does not match is refused (422) and nothing is stored.")],
            request_body={"required": True, "description": "JSON lines, one input record per line.",
                          "content": {media_type: {"schema": {"type": "string", "minLength": 1}}
                                      for media_type in JSONL_MEDIA_TYPES}},
            responses=_responses(
                _ok(_ref("InputUpload"), "Stored.", "201"),
                _ok(_ref("InputUpload"), "Already stored under this `sha256`: the same `uri`."), _AUTHED,
                e403="Not a user token (`wrong_role`), or a team the token is not scoped to (`wrong_team`).",
                e413="Over `MINIONS_MAX_INPUT_BYTES` (`too_large`) or the team's quota (`quota_exceeded`); the "
                     "limit is in the message and nothing is stored.",
                e415="The body is not JSONL (`unsupported_media_type`).",
                e422="The body is empty, `team` is not a valid name, or the body does not match `sha256`.",
            ),
        )),
    }


def schemas() -> dict[str, Schema]:
    return {
        "InputUpload": _object({"uri": {"type": "string"}, "bytes": {"type": "integer", "minimum": 1}}),
    }
