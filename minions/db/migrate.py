"""Builds and upgrades the schema, under an advisory lock (two services starting at once are safe;
re-running is a no-op).

Two folders of `sql/`, the current schema and the way to it:

- `sql/schema/NN_concern.sql`: today's schema, each table, function, view and trigger written once,
  by concern. A fresh database is built from it, in one transaction, and every migration is recorded
  as applied (the schema already holds them).
- `sql/migrations/NNNN_name.sql`: deltas, applied in order, once each, to a database built before
  them. `0000_baseline.sql` is the schema as it stood when the migrations began (frozen, never
  edited); each later file changes a database from the one before to the next, and the schema is
  edited in the same commit so that both roads end at the same database (tests/sql/test_migrations.py
  builds both and compares their catalogs).

Each applied migration's checksum is recorded: an applied file that later changed is reported, never
silently re-applied. A database whose ledger lacks the baseline was built by the numbered files that
preceded this layout: it is refused, never guessed at."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.resources.abc import Traversable

import asyncpg

from minions.db.connect import connect
from minions.db.gateways.migrate import MigrateGateway
from minions.db.paths import sql_dir

BASELINE = "0000_baseline.sql"
SCHEMA = "schema"


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class SqlFile:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def _numbered(folder: Traversable, what: str) -> list[SqlFile]:
    """The `.sql` files of `folder` whose names start with a number, in order. None found is an error,
    never an empty schema reported as up to date (a broken install must not look healthy)."""
    found = sorted(
        (p for p in folder.iterdir() if p.is_file() and p.name.endswith(".sql") and p.name[:2].isdigit()),
        key=lambda p: p.name,
    ) if folder.is_dir() else []
    if not found:
        raise MigrationError(f"no {what} found in {folder}: the schema is missing from this install")
    return [SqlFile(p.name, p.read_text(encoding="utf-8")) for p in found]


def schema_files(root: Traversable | None = None) -> list[SqlFile]:
    return _numbered((root or sql_dir()) / "schema", "schema files")


def migration_files(root: Traversable | None = None) -> list[SqlFile]:
    found = _numbered((root or sql_dir()) / "migrations", "migrations")
    if found[0].name != BASELINE:
        raise MigrationError(f"the first migration must be {BASELINE}, found {found[0].name}")
    return found


async def migrate(database_url: str, root: Traversable | None = None) -> list[str]:
    """Build or upgrade the schema; returns what was applied now: ['schema'] for a fresh database,
    else the names of the migrations applied."""
    schema, migrations = schema_files(root), migration_files(root)
    conn = await connect(database_url)
    try:
        return await apply(conn, schema, migrations)
    finally:
        await conn.close()


async def apply_migrations_only(conn: asyncpg.Connection, migrations: list[SqlFile]) -> list[str]:
    """The other road: every migration in order, the baseline first, as an upgraded database took
    them. For the test that both roads build one database; a service never takes it."""
    return await _locked(conn, lambda done: _pending(conn, migrations, done))


async def apply(conn: asyncpg.Connection, schema: list[SqlFile], migrations: list[SqlFile]) -> list[str]:
    async def step(done: dict[str, str]) -> list[str]:
        if not done:
            async with conn.transaction():
                for f in schema:
                    await conn.execute(f.sql)
                await _record(conn, migrations)
            return [SCHEMA]
        if BASELINE not in done:
            raise MigrationError(
                f"this database was built by the numbered schema files older than {BASELINE} "
                f"(its minion_migrations names {', '.join(sorted(done)[-2:])}); build a new database: "
                "`minions up` does, in a new --data-dir")
        return await _pending(conn, migrations, done)

    return await _locked(conn, step)


async def _locked(conn: asyncpg.Connection, step: Callable[[dict[str, str]], Awaitable[list[str]]]) -> list[str]:
    ledger = MigrateGateway(conn)  # the lock is a session lock: taken and released on this connection
    await ledger.lock()
    try:
        await ledger.create_ledger()
        return await step(await ledger.applied())
    finally:
        await ledger.unlock()


async def _pending(conn: asyncpg.Connection, migrations: list[SqlFile], done: dict[str, str]) -> list[str]:
    applied = []
    for m in migrations:
        if m.name in done:
            if done[m.name] != m.checksum:
                raise MigrationError(
                    f"{m.name} changed after it was applied; add a new migration instead of editing it")
            continue
        async with conn.transaction():
            await conn.execute(m.sql)
            await _record(conn, [m])
        applied.append(m.name)
    return applied


async def _record(conn: asyncpg.Connection, migrations: list[SqlFile]) -> None:
    await MigrateGateway(conn).record(checksums={m.name: m.checksum for m in migrations})
