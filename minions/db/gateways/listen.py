"""The LISTEN connection's one statement (`sql/queries/listen.sql`), for minions/db/listen.py."""

from __future__ import annotations

from minions.db.gateway import Gateway
from minions.db.queries import Queries


class ListenGateway(Gateway):
    queries = Queries("listen")

    async def probe(self, *, timeout: float) -> None:
        """A trivial statement that fails within `timeout` when the server is gone."""
        await self.db.execute(self.queries.probe, timeout=timeout)
