"""The migrator's bookkeeping (`sql/queries/migrate.sql`), for minions/db/migrate.py: its lock and
its ledger of applied files. The schema and migration files themselves are run by the migrator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from minions.db.gateway import Gateway, Runs
from minions.db.queries import Queries


class RunsMany(Runs, Protocol):
    """A connection: the ledger records a fresh schema's migrations in one executemany."""

    async def executemany(self, command: str, args: Iterable[Sequence[Any]], *,
                          timeout: float | None = None) -> None: ...


class MigrateGateway(Gateway):
    """On the migrator's one connection: its lock is a session lock, taken and released there."""

    queries = Queries("migrate")
    db: RunsMany

    def __init__(self, db: RunsMany) -> None:
        super().__init__(db)

    async def lock(self) -> None:
        """Waits for any other migrator to finish."""
        await self.db.execute(self.queries.lock)

    async def unlock(self) -> None:
        await self.db.execute(self.queries.unlock)

    async def create_ledger(self) -> None:
        await self.db.execute(self.queries.create_ledger)

    async def applied(self) -> dict[str, str]:
        """Each applied file's name and the checksum it had then."""
        return {row["name"]: row["checksum"] for row in await self.db.fetch(self.queries.applied)}

    async def record(self, *, checksums: Mapping[str, str]) -> None:
        """Records files as applied: name and checksum, in the mapping's order."""
        await self.db.executemany(self.queries.record, list(checksums.items()))
