"""API tokens: random secrets, stored only as their SHA-256."""

from __future__ import annotations

import hashlib
import secrets

TOKEN_ROLES = ("admin", "user", "executor")
# What a token list shows of a secret: "mn_" and 5 characters (30 of its 256 random bits), enough to
# tell one's own tokens apart, far too little to guess the rest.
PREFIX_LENGTH = 8


def new_token() -> str:
    return "mn_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def token_prefix(token: str) -> str | None:
    """None for a short secret chosen by hand (MINIONS_ADMIN_TOKEN): its prefix would give too much away."""
    return token[:PREFIX_LENGTH] if len(token) >= 32 else None
