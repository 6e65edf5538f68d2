"""The CLI's one door to the database, for the operator commands that work on it directly (with the
API down too): every statement of `sql/queries/cli.sql` (tokens) and `sql/queries/inputs.sql`
(which inputs a team may read), wrapped once with keyword arguments and a typed result (the base is
minions/db/gateway.py). The SQL functions behind them (sql/schema/09_tokens.sql,
sql/schema/08_inputs.sql) are the API's too, so both enforce the same rules."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypedDict

from minions.db.connect import connect
from minions.db.gateway import Gateway, Row
from minions.db.queries import Queries

# A token as minion_tokens lists it (never its hash).
TokenRow = Row


class InputPrefixRow(TypedDict):
    prefix: str
    created_at: dt.datetime


class CliGateway(Gateway):
    queries = Queries("cli")
    input_queries = Queries("inputs")

    # ---- tokens

    async def insert_token(self, *, token_hash: bytes, prefix: str | None, role: str, team: str | None, label: str,
                           expires_in_s: float | None, owner: str | None, trusted: bool) -> None:
        """A token stored by its hash; `prefix` None for a short secret chosen by hand (it would give too
        much away), `expires_in_s` None for never, `owner` None for the token's own."""
        await self.db.execute(self.queries.insert_token, token_hash, prefix, role, team, label, expires_in_s, owner,
                              trusted)

    async def list_tokens(self, *, status: str | None) -> list[TokenRow]:
        """Every token, or those of one status, by id."""
        return await self.db.fetch(self.queries.list_tokens, status)

    async def revoke_token(self, *, token_id: int) -> dt.datetime | None:
        """When the token was revoked (now, or earlier); None when there is no such token."""
        revoked_at: dt.datetime | None = await self.db.fetchval(self.queries.revoke_token, token_id)
        return revoked_at

    # ---- inputs a team may read

    async def allow_input(self, *, team: str, prefix: str) -> bool:
        """Lets the team's tasks read under an s3:// prefix; False when they already could
        (asyncpg.CheckViolationError when it is no s3://bucket/prefix)."""
        return bool(await self.db.fetchval(self.input_queries.allow_input, team, prefix))

    async def disallow_input(self, *, team: str, prefix: str) -> bool:
        """False when the prefix was not allowed."""
        return bool(await self.db.fetchval(self.input_queries.disallow_input, team, prefix))

    async def input_prefixes(self, *, team: str) -> list[InputPrefixRow]:
        rows: list[InputPrefixRow] = await self.db.fetch(self.input_queries.input_prefixes, team)
        return rows

    async def team_input_bytes(self, *, team: str) -> int:
        """The bytes of input the team stores."""
        return int(await self.db.fetchval(self.input_queries.team_input_bytes, team))


@asynccontextmanager
async def connected(database_url: str) -> AsyncIterator[CliGateway]:
    """The gateway on a connection of its own, closed after: one command's statements."""
    conn = await connect(database_url)
    try:
        yield CliGateway(conn)
    finally:
        await conn.close()
