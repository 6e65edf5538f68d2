"""Bearer tokens and roles. Tokens are looked up by hash, with a short cache so the hot path
(claim, heartbeat) does not pay a query per request."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiohttp import web

from minions.services.api.gateway import ApiGateway
from minions.services.api.http.errors import ApiError, forbidden
from minions.tokens import hash_token

CACHE_SECONDS = 10.0


@dataclass(frozen=True)
class Principal:
    token_id: int
    role: str
    team: str | None

    def can_see_team(self, team: str) -> bool:
        return self.role == "admin" or self.team is None or self.team == team




PRINCIPAL = web.RequestKey("principal", Principal)


class TokenCache:
    """Principals by token digest, each for CACHE_SECONDS at most and never past its token's expiry.

    Every API process LISTENs on `tokens` (through the claim waiters' one LISTEN connection), where
    the database announces each revoked or changed token (sql/schema/09_tokens.sql): its entry
    is dropped at once, so a revocation bites on every process within the notification's delivery,
    not after the cache's lifetime. While that connection is down nothing is cached, and on each
    (re)connect the cache starts empty: a notification missed meanwhile cannot keep a revoked token
    alive."""

    channel = "tokens"

    def __init__(self) -> None:
        self._entries: dict[bytes, tuple[float, Principal | None]] = {}
        self._digests: dict[int, bytes] = {}  # token id -> digest, to drop an entry by its id
        # Bumped by every invalidation: a lookup whose query raced one does not cache its answer.
        self._generation = 0
        self.listening = False

    def notified(self, payload: str) -> None:
        self._generation += 1
        try:
            token_id = int(payload)
        except ValueError:  # not ours to read: forget everything rather than guess
            self._clear()
            return
        digest = self._digests.pop(token_id, None)
        if digest is not None:
            self._entries.pop(digest, None)

    def listening_changed(self, listening: bool) -> None:
        self._generation += 1
        self._clear()
        self.listening = listening

    def _clear(self) -> None:
        self._entries.clear()
        self._digests.clear()

    async def lookup(self, gateway: ApiGateway, token: str) -> Principal | None:
        digest = hash_token(token)
        now = time.monotonic()
        hit = self._entries.get(digest) if self.listening else None
        if hit is not None and hit[0] > now:
            return hit[1]
        generation = self._generation
        row = await gateway.principal_by_token_hash(token_hash=digest)
        principal = Principal(row["id"], row["role"], row["team"]) if row else None
        if self.listening and generation == self._generation:
            lifetime = CACHE_SECONDS
            if row is not None and row["expires_in_s"] is not None:
                lifetime = min(lifetime, row["expires_in_s"])
            if len(self._entries) > 10_000:
                self._clear()
            self._entries[digest] = (now + lifetime, principal)
            if principal is not None:
                self._digests[principal.token_id] = digest
        return principal


async def authenticate(request: web.Request, cache: TokenCache, gateway: ApiGateway) -> Principal:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "missing bearer token (Authorization: Bearer <token>)",
                       headers={"WWW-Authenticate": "Bearer"})
    token = token.strip()
    if not (token.isascii() and token.isprintable()):
        # Tokens are ASCII; other bytes (an undecodable header arrives as surrogates) would break
        # the hashing below: no such token exists.
        raise ApiError(401, "unauthorized", "malformed bearer token: tokens are printable ASCII",
                       headers={"WWW-Authenticate": "Bearer"})
    principal = await cache.lookup(gateway, token)
    if principal is None:
        raise ApiError(401, "unauthorized", "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    return principal


def require(request: web.Request, *roles: str) -> Principal:
    principal = request[PRINCIPAL]
    if principal.role != "admin" and principal.role not in roles:
        raise forbidden(f"this needs a token with role {' or '.join(roles)}; yours is {principal.role}",
                        "wrong_role")
    return principal
