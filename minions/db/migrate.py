"""Applies `sql/NNN_*.sql` in order, once each, under an advisory lock (two services starting at
once are safe; re-running is a no-op). Records each file's checksum: an applied file that later
changed is reported, never silently re-applied."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources.abc import Traversable

import asyncpg

from minions.db.connect import connect
from minions.db.paths import sql_dir

# A fixed advisory-lock key for the migrator (split locks use positive task ids).
MIGRATE_LOCK_KEY = -707_101


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(folder: Traversable | None = None) -> list[Migration]:
    """The numbered migrations in `folder` (the packaged schema by default), in order. None found is an
    error, never an empty schema reported as up to date (a broken install must not look healthy)."""
    folder = folder or sql_dir()
    found = sorted(
        (p for p in folder.iterdir() if p.is_file() and p.name.endswith(".sql") and p.name[:3].isdigit()),
        key=lambda p: p.name,
    )
    if not found:
        raise MigrationError(f"no migrations found in {folder}: the schema is missing from this install")
    return [Migration(p.name, p.read_text(encoding="utf-8")) for p in found]


async def migrate(database_url: str, folder: Traversable | None = None) -> list[str]:
    """Apply pending migrations; returns the names applied now."""
    migrations = discover(folder)
    conn = await connect(database_url)
    try:
        return await apply(conn, migrations)
    finally:
        await conn.close()


async def apply(conn: asyncpg.Connection, migrations: list[Migration]) -> list[str]:
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATE_LOCK_KEY)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS minion_migrations (
                   name text PRIMARY KEY, checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {r["name"]: r["checksum"] for r in await conn.fetch("SELECT name, checksum FROM minion_migrations")}
        applied = []
        for m in migrations:
            if m.name in done:
                if done[m.name] != m.checksum:
                    raise MigrationError(
                        f"{m.name} changed after it was applied; add a new migration instead of editing it"
                    )
                continue
            async with conn.transaction():
                await conn.execute(m.sql)
                await conn.execute(
                    "INSERT INTO minion_migrations (name, checksum) VALUES ($1, $2)", m.name, m.checksum
                )
            applied.append(m.name)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATE_LOCK_KEY)
