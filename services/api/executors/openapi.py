"""The OpenAPI part of routes.py: the executor list, registering, an admin's release of a quarantine,
and deregistering; with the Executor schema. (Claim and heartbeat: leasing/openapi.py.)
openapi/document.py assembles it, in the order the document has always listed them."""

from __future__ import annotations

from minions.services.api.openapi.components import AUTHED as _AUTHED
from minions.services.api.openapi.components import BODY as _BODY
from minions.services.api.openapi.components import EXECUTOR_ERRORS as _EXECUTOR_ERRORS
from minions.services.api.openapi.components import EXECUTOR_ID as _EXECUTOR_ID
from minions.services.api.openapi.components import json_body as _json_body
from minions.services.api.openapi.components import name as _name
from minions.services.api.openapi.components import nullable as _nullable
from minions.services.api.openapi.components import object_schema as _object
from minions.services.api.openapi.components import operation, path_item
from minions.services.api.openapi.components import query_param as _query_param
from minions.services.api.openapi.components import timestamp as _timestamp
from minions.services.api.openapi.parts import Schema
from minions.services.api.openapi.parts import error as _error
from minions.services.api.openapi.parts import ok as _ok
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses

EXECUTOR_STATUSES = ["online", "busy", "idle", "offline", "lost"]


def list_path() -> dict[str, Schema]:
    return {
        "/api/v1/executors": path_item(get=operation(
            "listExecutors", "executors", "Executors and what they are doing",
            parameters=[_query_param("team", _name("team"),
                                     "Executors that may work for this team (default: the token's team).")],
            responses=_responses(_ok(_ref("ExecutorList"), "The executors."), _AUTHED,
                                 e403="Not a user token (`wrong_role`), or another team (`wrong_team`).",
                                 e422="Not a valid team name."),
        )),
    }


def register_path() -> dict[str, Schema]:
    return {
        "/api/v1/executors/register": path_item(post=operation(
            "registerExecutor", "executor protocol", "Register an executor (or update it)",
            request_body=_json_body(_ref("ExecutorRegistration"), "The machine and what it serves."),
            responses=_responses(
                _ok(_ref("Registered"), "Registered: its id and the protocol timings.", "201"), _AUTHED, _BODY,
                {"429": {**_error("The token registered `MINIONS_REGISTRATIONS_PER_MINUTE` new executor names in "
                                  "the last minute (`too_many_registrations`); retry after `Retry-After` seconds."),
                         "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1},
                                                     "required": True}}}},
                e403="Not an executor token (`wrong_role`), or the token holds "
                     "`MINIONS_MAX_EXECUTORS_PER_TOKEN` executor names already (`too_many_executors`).",
                e422="Invalid values, each named in `fields` (a `hardware` over 8,192 bytes of JSON among them)."),
        )),
    }


def release_and_deregister_paths() -> dict[str, Schema]:
    return {
        "/api/v1/executors/{executor_id}/release": path_item(_EXECUTOR_ID, post=operation(
            "releaseExecutor", "executors", "Lift an executor's quarantine (admin)",
            description="It claims again, its results checked until it earns trust again.",
            responses=_responses(_ok(_object({"executor_id": {"type": "string", "format": "uuid"},
                                              "quarantined": {"type": "boolean"}}), "Released."),
                                 _AUTHED, e403="Not an admin token (`wrong_role`).",
                                 e409="Not quarantined, or no such executor (`not_quarantined`)."),
        )),
        "/api/v1/executors/{executor_id}/deregister": path_item(_EXECUTOR_ID, post=operation(
            "deregister", "executor protocol", "Go offline, releasing every lease",
            responses=_responses(_ok(_ref("Deregistered"), "Offline."), _AUTHED, **_EXECUTOR_ERRORS),
        )),
    }


def schemas() -> dict[str, Schema]:
    return {
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
    }
