"""The OpenAPI part of routes.py: an executor's claim and heartbeat, and complete, fail and release of
one lease or many. Their messages' schemas are generated from minions/protocol.py. openapi/document.py
assembles it, in the order the document has always listed them."""

from __future__ import annotations

from minions.services.api.openapi.components import AUTHED as _AUTHED
from minions.services.api.openapi.components import BODY as _BODY
from minions.services.api.openapi.components import EXECUTOR_ERRORS as _EXECUTOR_ERRORS
from minions.services.api.openapi.components import EXECUTOR_ID as _EXECUTOR_ID
from minions.services.api.openapi.components import json_body as _json_body
from minions.services.api.openapi.components import operation, path_item
from minions.services.api.openapi.components import path_param as _path_param
from minions.services.api.openapi.components import query_param as _query_param
from minions.services.api.openapi.parts import Schema
from minions.services.api.openapi.parts import ok as _ok
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses

_LEASE_TOKEN = [_path_param("token", {"type": "string", "format": "uuid"},
                            "The lease token of a claim (`lease.token`).")]
_LEASE_ERRORS = {"e403": "Not an executor token (`wrong_role`), or the lease is held by an executor of another "
                         "token (`not_your_lease`)."}


def claim_and_heartbeat_paths() -> dict[str, Schema]:
    return {
        "/api/v1/executors/{executor_id}/claim": path_item(_EXECUTOR_ID, post=operation(
            "claim", "executor protocol", "Claim a subtask (long poll)",
            description="Preferences first, then priority and submission order; only kinds and models "
                        "the executor advertised.",
            parameters=[
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
            responses=_responses(
                _ok({"oneOf": [_ref("Lease"), _ref("LeaseBatch")]},
                    "A lease on a subtask (without `max`), or a batch of them (with it)."),
                {"204": {"description": "Nothing to do within `wait` seconds."}},
                _AUTHED, **{**_EXECUTOR_ERRORS, "e403": _EXECUTOR_ERRORS["e403"] + " Or the executor is "
                            "quarantined (`quarantined`, with the reason): its results lost spot checks."},
                e409="The executor deregistered (`deregistered`).",
                e422="`wait` is not a number from 0 to 86400, `max` not a whole number from 1, or `params` "
                     "neither each nor once.",
            ),
        )),
        "/api/v1/executors/{executor_id}/heartbeat": path_item(_EXECUTOR_ID, post=operation(
            "heartbeat", "executor protocol", "Say the executor is alive, and learn the fate of its leases",
            request_body=_json_body(_ref("Heartbeat"), "The leases held (an empty body holds none).",
                                    required=False),
            responses=_responses(_ok(_ref("HeartbeatReply"), "Each lease: ok, lost or cancelled; a fresh "
                                                           "input URL for each lease renewed that reads "
                                                           "its input by URL (`input_urls`)."),
                                 _AUTHED, _BODY, **_EXECUTOR_ERRORS,
                                 e422="`leases` is not a list of at most 1000 strings."),
        )),
    }


def lease_paths() -> dict[str, Schema]:
    return {
        "/api/v1/leases/{token}/complete": path_item(_LEASE_TOKEN, post=operation(
            "completeLease", "executor protocol", "Commit a subtask whose output was written",
            description="The output is verified first: one JSONL line per input record of the "
                        "subtask, with the input's ids in order, each of its kind's shape. A "
                        "verified copy is committed "
                        "(its SHA-256 recorded); the output URL stops working.",
            request_body=_json_body(_ref("Completion"), "What was done."),
            responses=_responses(
                _ok(_ref("Ok"), "Committed (or committed already by this lease: a retried complete)."),
                _AUTHED, _BODY, **_LEASE_ERRORS,
                e409="The lease is no longer current (`lease_lost`), its task was cancelled "
                     "(`task_cancelled`), or the output was not written (`output_missing`).",
                e422="`records` is missing, negative, or not the subtask's record count (`invalid`); "
                     "or the output does not hold one line per record with the input's ids in order, "
                     "or a line breaks its kind's shape (API.md, Output object) or repeats a key "
                     "(`output_mismatch`, naming the line and the field: nothing committed, the lease "
                     "stays live).",
            ),
        )),
        "/api/v1/leases/{token}/fail": path_item(_LEASE_TOKEN, post=operation(
            "failLease", "executor protocol", "Report a failed attempt",
            description="A retryable failure requeues the subtask until its attempts run out.",
            request_body=_json_body(_ref("Failure"), "What went wrong."),
            responses=_responses(
                _ok(_ref("Ok"), "Recorded."), _AUTHED, _BODY, **_LEASE_ERRORS,
                e409="The lease is no longer current (`lease_lost`) or its task was cancelled "
                     "(`task_cancelled`).",
                e422="`error` is missing or blank, or `retryable` is not a boolean.",
            ),
        )),
        "/api/v1/leases/{token}/release": path_item(_LEASE_TOKEN, post=operation(
            "releaseLease", "executor protocol", "Hand a subtask back without counting an attempt",
            responses=_responses(
                _ok(_ref("Ok"), "Requeued."), _AUTHED, **_LEASE_ERRORS,
                e409="The lease is no longer current (`lease_lost`) or its task was cancelled "
                     "(`task_cancelled`).",
            ),
        )),
        **_batched_lease_paths(),
    }


def _batched_lease_paths() -> dict[str, Schema]:
    """Complete, fail and release of many leases in one request: each lease answered on its own."""
    outcomes = _ok(_ref("BatchReply"), "Each lease's outcome, in the order sent: the HTTP status and error its own "
                                       "request would have had (200: done).")
    errors = {"e403": _LEASE_ERRORS["e403"].replace("or the lease is held", "per lease: or a lease held"),
              "e422": "The body is not the batch's shape, each fault named in `fields`."}
    return {
        f"/api/v1/leases/{step}": path_item(post=operation(
            f"{step}Leases", "executor protocol", summary,
            request_body=_json_body(_ref(schema), "The leases, each as its own request would carry it."),
            responses=_responses(outcomes, _AUTHED, _BODY, **errors),
        ))
        for step, schema, summary in (
            ("complete", "CompletionBatch", "Commit many subtasks (outputs written, or inline)"),
            ("fail", "FailureBatch", "Report many failed attempts"),
            ("release", "ReleaseBatch", "Hand many subtasks back without counting attempts"),
        )
    }
