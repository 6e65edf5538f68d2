"""Token lifecycle for admins: list, create (optionally expiring), revoke. The same SQL functions
as `minions token …` (sql/schema/09_tokens.sql); a list never shows a secret, only its prefix."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from minions.logging import get_logger
from minions.names import NAME
from minions.services.api.appkeys import GATEWAY
from minions.services.api.http.auth import require
from minions.services.api.http.bodies import json_object
from minions.services.api.http.errors import conflict, invalid, not_found
from minions.services.api.http.responses import iso, json_response
from minions.tokens import TOKEN_ROLES, hash_token, new_token, token_prefix

log = get_logger(__name__)
routes = web.RouteTableDef()
STATUSES = ("active", "expired", "revoked")
MAX_LABEL = 200
MAX_CREATION_BYTES = 64 * 1024  # a role, a team, a label and an expiry
MAX_EXPIRES_IN_S = 10 * 365 * 86400.0  # ten years: longer is "never" (leave it out)
MAX_TOKEN_ID = 2**63 - 1


def token_json(row: Any) -> dict[str, Any]:
    return {"id": row["id"], "prefix": row["prefix"], "role": row["role"], "team": row["team"],
            "label": row["label"], "status": row["status"], "created_at": iso(row["created_at"]),
            "expires_at": iso(row["expires_at"]), "revoked_at": iso(row["revoked_at"]), "owner": row["owner"],
            "trusted": row["trusted"]}


@routes.get("/api/v1/tokens")
async def list_tokens(request: web.Request) -> web.Response:
    require(request, "admin")
    status = request.query.get("status") or None
    if status is not None and status not in STATUSES:
        raise invalid({"status": f"one of {', '.join(STATUSES)}"})
    rows = await request.app[GATEWAY].list_tokens(status=status)
    return json_response({"tokens": [token_json(r) for r in rows]})


def _creation(body: dict[str, Any]) -> tuple[str, str | None, str, float | None, str | None, bool]:
    errors: dict[str, str] = {}
    if unknown := sorted(set(body) - {"role", "team", "label", "expires_in_s", "owner", "trusted"}):
        errors.update({key: "unknown field" for key in unknown})
    role = body.get("role")
    if role not in TOKEN_ROLES:
        errors["role"] = f"required: one of {', '.join(TOKEN_ROLES)}"
    team = body.get("team")
    if team is not None and (not isinstance(team, str) or not NAME.match(team)):
        errors["team"] = "not a valid name"
    label = body.get("label", "")
    if not isinstance(label, str) or len(label) > MAX_LABEL or "\x00" in label:
        errors["label"] = f"a string of at most {MAX_LABEL} characters, without NUL"
    expires_in_s = body.get("expires_in_s")
    if expires_in_s is not None and (isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int | float)
                                     or not 0 < expires_in_s <= MAX_EXPIRES_IN_S):
        errors["expires_in_s"] = f"seconds, above 0 and at most {MAX_EXPIRES_IN_S:.0f} (leave out: never expires)"
    owner = body.get("owner")
    if owner is not None and (not isinstance(owner, str) or not 1 <= len(owner) <= 200 or owner.startswith("token:")
                              or "\x00" in owner):
        errors["owner"] = "1-200 characters, without NUL, not starting with 'token:' (leave out: the token itself)"
    trusted = body.get("trusted", False)
    if not isinstance(trusted, bool):
        errors["trusted"] = "true or false"
    elif trusted and role != "executor":
        errors["trusted"] = "only an executor token is trusted (machines an admin vouches for)"
    if errors:
        raise invalid(errors)
    return str(role), team, label, None if expires_in_s is None else float(expires_in_s), owner, trusted


@routes.post("/api/v1/tokens")
async def create_token(request: web.Request) -> web.Response:
    principal = require(request, "admin")
    role, team, label, expires_in_s, owner, trusted = _creation(await json_object(request, limit=MAX_CREATION_BYTES))
    token = new_token()
    gateway = request.app[GATEWAY]
    token_id = await gateway.create_token(token_hash=hash_token(token), prefix=token_prefix(token), role=role,
                                          team=team, label=label, expires_in_s=expires_in_s, owner=owner,
                                          trusted=trusted)
    row = await gateway.token_by_id(token_id=token_id)
    log.info("token_created", token_id=token_id, role=role, team=team, by_token_id=principal.token_id)
    # The only time the secret is ever shown: it is stored hashed.
    return json_response({"token": token, **token_json(row)}, 201)


@routes.post("/api/v1/tokens/{token_id}/revoke")
async def revoke_token(request: web.Request) -> web.Response:
    principal = require(request, "admin")
    raw = request.match_info["token_id"]
    if not raw.isascii() or not raw.isdigit() or int(raw) > MAX_TOKEN_ID:
        raise not_found(f"token {raw}")
    token_id = int(raw)
    if token_id == principal.token_id:
        # An admin who revokes the token in hand locks itself out: do it with another admin token, or
        # with `minions token revoke` on the database.
        raise conflict("own_token", "this is the token of this request; revoke it with another admin token "
                                    "or `minions token revoke`")
    gateway = request.app[GATEWAY]
    revoked_at = await gateway.revoke_token(token_id=token_id)
    if revoked_at is None:
        raise not_found(f"token {token_id}")
    log.info("token_revoked", token_id=token_id, by_token_id=principal.token_id)
    return json_response(token_json(await gateway.token_by_id(token_id=token_id)))
