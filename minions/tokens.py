"""API tokens: random secrets, stored only as their SHA-256."""

from __future__ import annotations

import hashlib
import secrets

ROLES = ("admin", "user", "executor")


def new_token() -> str:
    return "mn_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
