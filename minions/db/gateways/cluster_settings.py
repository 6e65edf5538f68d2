"""The cluster-wide values (`sql/queries/cluster_settings.sql`), for minions/cluster_settings.py."""

from __future__ import annotations

from typing import TypedDict

from minions.db.gateway import Gateway
from minions.db.queries import Queries


class ClusterSettingsRow(TypedDict):
    lease_timeout_s: float
    max_attempts: int


class ClusterSettingsGateway(Gateway):
    queries = Queries("cluster_settings")

    async def read(self) -> ClusterSettingsRow:
        row: ClusterSettingsRow | None = await self.db.fetchrow(self.queries.read)
        assert row is not None  # the function always returns its one row
        return row

    async def set(self, *, key: str, value: str) -> str:
        """Stores one value, validated in SQL (asyncpg.CheckViolationError names what is wrong); the
        value as stored."""
        return str(await self.db.fetchval(self.queries.set, key, value))
