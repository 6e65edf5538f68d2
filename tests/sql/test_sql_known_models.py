"""The models the pool knows (sql/schema/05_executors.sql): every capability an executor advertises
joins known_models at registration and stays there when the executor leaves or serves other models;
'sleep:*' is no model; a model may hold ':'. Migration 0006 fills the table from what executors had
advertised before it: their capabilities and their fingerprint history."""

from __future__ import annotations

from minions.db.connect import connect
from minions.db.migrate import apply_migrations_only, migration_files
from minions.testing.factories import make_executor, make_token
from tests.support.database import TestDatabases

KNOWN = "SELECT capability, kind, model FROM known_models ORDER BY capability"


async def test_advertised_models_are_known_for_good(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        _, token_id = await make_token(conn, "executor")
        assert await conn.fetchval("SELECT minion_model_known('embedding', 'org/e5')") is False
        await make_executor(conn, token_id, name="mac", kinds=("embedding", "completion", "sleep"),
                            models=("org/e5", "llama3:8b"))
        assert [tuple(r) for r in await conn.fetch(KNOWN)] == [
            ("completion:llama3:8b", "completion", "llama3:8b"), ("completion:org/e5", "completion", "org/e5"),
            ("embedding:llama3:8b", "embedding", "llama3:8b"), ("embedding:org/e5", "embedding", "org/e5")]
        first = await conn.fetchval("SELECT advertised_at FROM known_models WHERE capability = 'embedding:org/e5'")

        # The same machine registers again serving another model, then leaves: nothing is forgotten,
        # and what was known keeps the time it was first advertised.
        await make_executor(conn, token_id, name="mac", kinds=("embedding",), models=("org/bge",))
        await conn.execute("UPDATE executors SET status = 'offline'")
        assert [r["capability"] for r in await conn.fetch(KNOWN)] == [
            "completion:llama3:8b", "completion:org/e5", "embedding:llama3:8b", "embedding:org/bge",
            "embedding:org/e5"]
        assert await conn.fetchval(
            "SELECT advertised_at FROM known_models WHERE capability = 'embedding:org/e5'") == first
        # A model named with a revision is the model itself, as claims have it.
        assert await conn.fetchval("SELECT minion_model_known('embedding', 'org/e5@abc123')") is True
        assert await conn.fetchval("SELECT minion_model_known('completion', 'org/bge')") is False
    finally:
        await conn.close()


async def test_the_migration_fills_in_what_executors_advertised_before_it(databases: TestDatabases) -> None:
    url = await databases.empty()
    migrations = migration_files()
    before = [m for m in migrations if m.name < "0006"]
    conn = await connect(url)
    try:
        await apply_migrations_only(conn, before)
        _, token_id = await make_token(conn, "executor")
        executor = await make_executor(conn, token_id, name="mac", kinds=("embedding", "sleep"), models=("org/e5",))
        # What it served before its last registration survives in its fingerprint history only.
        await conn.execute("""INSERT INTO executor_fingerprint_history (executor_id, capability, model, fingerprint,
                                                                        valid_from, valid_to)
                              VALUES ($1, 'embedding:org/old', 'org/old', 'f', now() - interval '1 day', now())""",
                           executor)
        assert await apply_migrations_only(conn, migrations) == [m.name for m in migrations if m not in before]
        assert [tuple(r) for r in await conn.fetch(KNOWN)] == [
            ("embedding:org/e5", "embedding", "org/e5"), ("embedding:org/old", "embedding", "org/old")]
    finally:
        await conn.close()
