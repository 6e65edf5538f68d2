"""Tokens for probes of team isolation: two teams' users, an admin and a shared executor."""

from __future__ import annotations

from minions.db.connect import connect
from minions.testing.factories import make_token


async def tenant_tokens(database_url: str) -> dict[str, str]:
    conn = await connect(database_url)
    try:
        return {"alpha": (await make_token(conn, "user", "alpha"))[0],
                "beta": (await make_token(conn, "user", "beta"))[0],
                "admin": (await make_token(conn, "admin"))[0],
                "executor": (await make_token(conn, "executor"))[0]}
    finally:
        await conn.close()
