"""The OpenAPI part of usage_routes.py, teams_routes.py and tokens_routes.py: compute used, teams' shares
of the pool, and the token lifecycle; with their schemas. openapi/document.py assembles it, in the
order the document has always listed them (the token operations last)."""

from __future__ import annotations

from minions.services.api.openapi.components import AUTHED as _AUTHED
from minions.services.api.openapi.components import BODY as _BODY
from minions.services.api.openapi.components import NO_NUL, operation, path_item
from minions.services.api.openapi.components import integer as _int
from minions.services.api.openapi.components import json_body as _json_body
from minions.services.api.openapi.components import name as _name
from minions.services.api.openapi.components import nullable as _nullable
from minions.services.api.openapi.components import object_schema as _object
from minions.services.api.openapi.components import path_param as _path_param
from minions.services.api.openapi.components import query_param as _query_param
from minions.services.api.openapi.components import timestamp as _timestamp
from minions.services.api.openapi.parts import Schema
from minions.services.api.openapi.parts import ok as _ok
from minions.services.api.openapi.parts import ref as _ref
from minions.services.api.openapi.parts import responses as _responses
from minions.team_shares import MAX_LEASES, MAX_PRIORITY_CAP, MAX_WEIGHT, MIN_PRIORITY_CAP
from minions.tokens import TOKEN_ROLES
from minions.usage import DEFAULT_SINCE, SINCE_PATTERN, SINCE_RULE, USAGE_BY

# ---------------------------------------------------------------- request schemas


def request_schemas() -> dict[str, Schema]:
    return {
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


def schemas() -> dict[str, Schema]:
    return {
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
    }


# ---------------------------------------------------------------- operations


def usage_path() -> dict[str, Schema]:
    return {
        "/api/v1/usage": path_item(get=operation(
            "getUsage", "usage", "Compute used per team, given per executor or owner",
            description="Every attempt that ended in the window, its compute-seconds charged to the team whose "
                        "task it ran and credited to the executor (and owner) that ran it; docs/API.md says "
                        "how each outcome counts.",
            parameters=[
                _query_param("since", {"type": "string", "pattern": SINCE_PATTERN, "default": DEFAULT_SINCE},
                             f"The window back from now: {SINCE_RULE}."),
                _query_param("team", _name("team"), "Only this team's usage (default: the token's team; an "
                                                    "admin's: every team)."),
                _query_param("by", {"type": "string", "enum": list(USAGE_BY), "default": "team"},
                             "One row per team, per executor or per owner."),
            ],
            responses=_responses(_ok(_ref("Usage"), "The usage, most compute first."), _AUTHED,
                                 e403="Not a user token (`wrong_role`), or another team (`wrong_team`).",
                                 e422="`since`, `by` or `team` breaks its rule (named in `fields`)."),
        )),
    }


def team_paths() -> dict[str, Schema]:
    return {
        "/api/v1/teams": path_item(get=operation(
            "listTeamShares", "teams", "Each known team's share of the pool: weight, priority cap, lease cap",
            description="A team is known once a token, task or executor names it. An admin, or a user "
                        "scoped to no team, sees every known team; a team's user sees its own.",
            responses=_responses(_ok(_ref("TeamShareList"), "The teams, by name."), _AUTHED,
                                 e403="Not a user token (`wrong_role`)."),
        )),
        "/api/v1/teams/{team}": path_item(
            [_path_param("team", _name("team"), "A known team.")],
            patch=operation(
                "setTeamShare", "teams", "Set a team's weight, priority cap or lease cap (admin)",
                request_body=_json_body(_ref("TeamShareChange"), "The values to change."),
                responses=_responses(
                    _ok(_ref("TeamShare"), "The team's share as it is now."), _AUTHED, _BODY,
                    e403="Not an admin token (`wrong_role`).",
                    e422="A value breaks its rule, an unknown field or an empty body (`invalid`, each named in "
                         "`fields`); or no token, task or executor names the team (`unknown_team`): nothing "
                         "is changed.",
                ),
            ),
        ),
    }


def token_paths() -> dict[str, Schema]:
    return {
        "/api/v1/tokens": path_item(
            get=operation(
                "listTokens", "tokens", "List tokens (never their secrets)",
                parameters=[_query_param("status", {"type": "string", "enum": ["active", "expired", "revoked"]},
                                         "Only tokens in this state.")],
                responses=_responses(_ok(_ref("TokenList"), "The tokens, oldest first."), _AUTHED,
                                     e403="Not an admin token (`wrong_role`).",
                                     e422="Not a known status."),
            ),
            post=operation(
                "createToken", "tokens", "Create a token, optionally expiring",
                request_body=_json_body(_ref("TokenRequest"), "Its role, team scope, label and lifetime."),
                responses=_responses(_ok(_ref("CreatedToken"), "Created; the secret is shown this once.", "201"),
                                     _AUTHED, _BODY, e403="Not an admin token (`wrong_role`).",
                                     e422="Invalid values, each named in `fields`."),
            ),
        ),
        "/api/v1/tokens/{token_id}/revoke": path_item(
            [_path_param("token_id", {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                         "The token's id (`GET /api/v1/tokens`).")],
            post=operation(
                "revokeToken", "tokens", "Revoke a token: every API process refuses it within a second",
                responses=_responses(
                    _ok(_ref("Token"), "Revoked (revoking a revoked token changes nothing)."), _AUTHED,
                    e403="Not an admin token (`wrong_role`).",
                    e404="No such token.",
                    e409="The token of this very request (`own_token`): revoke it with another admin token "
                         "or `minions token revoke`.",
                ),
            ),
        ),
    }
