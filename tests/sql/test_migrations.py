"""The schema and the migrations: a fresh database is built from sql/schema/, an older one is brought
forward by sql/migrations/, and both roads end at the same database, object by object. Each SQL
function, view and trigger is written once, in the schema."""

from __future__ import annotations

import re

import pytest

from minions.db.connect import connect
from minions.db.migrate import (
    MigrationError,
    SqlFile,
    apply,
    apply_migrations_only,
    migrate,
    migration_files,
    schema_files,
)
from tests.support.catalog import differences, snapshot
from tests.support.database import TestDatabases
from tests.support.paths import REPO

_CREATE = re.compile(r"^CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|VIEW|TRIGGER|CONSTRAINT\s+TRIGGER)\s+(\w+)",
                     re.IGNORECASE | re.MULTILINE)


async def test_the_schema_and_the_migrations_build_the_same_database(databases: TestDatabases) -> None:
    by_schema, by_migrations = await databases.empty(), await databases.empty()
    assert await migrate(by_schema) == ["schema"]
    conn = await connect(by_migrations)
    try:
        assert await apply_migrations_only(conn, migration_files()) == [m.name for m in migration_files()]
        built_by_migrations = await snapshot(conn)
    finally:
        await conn.close()
    conn = await connect(by_schema)
    try:
        built_by_schema = await snapshot(conn)
        # Every migration is recorded as applied: the schema holds them all.
        recorded = [r["name"] for r in await conn.fetch("SELECT name FROM minion_migrations ORDER BY name")]
        assert recorded == [m.name for m in migration_files()]
    finally:
        await conn.close()
    assert sum(k.startswith("function ") for k in built_by_schema) > 100
    assert differences(built_by_schema, built_by_migrations) == []


async def test_a_second_run_changes_nothing(databases: TestDatabases) -> None:
    url = await databases.empty()
    assert await migrate(url) == ["schema"]
    assert await migrate(url) == []


async def test_a_later_migration_is_applied_once_to_a_database_built_before_it(databases: TestDatabases) -> None:
    """A delta after the baseline reaches a database built without it, once; one built with it
    (fresh, from a schema that has it) records it without running it."""
    url = await databases.empty()
    schema, migrations = schema_files(), migration_files()
    conn = await connect(url)
    try:
        assert await apply(conn, schema, migrations) == ["schema"]
        delta = SqlFile("9999_test_delta.sql", "CREATE TABLE test_delta (id int PRIMARY KEY);")
        assert await apply(conn, schema, [*migrations, delta]) == ["9999_test_delta.sql"]
        assert await apply(conn, schema, [*migrations, delta]) == []
        assert await conn.fetchval("SELECT to_regclass('test_delta') IS NOT NULL")
        edited = SqlFile("9999_test_delta.sql", "CREATE TABLE test_delta (id bigint PRIMARY KEY);")
        with pytest.raises(MigrationError, match=r"9999_test_delta\.sql changed after it was applied"):
            await apply(conn, schema, [*migrations, edited])
    finally:
        await conn.close()


async def test_a_database_of_the_numbered_files_before_the_baseline_is_refused(databases: TestDatabases) -> None:
    """A database built by the numbered files that preceded sql/schema/ is not guessed at: refused by
    name, with what to do, and left as it was."""
    url = await databases.empty()
    assert await migrate(url) == ["schema"]
    conn = await connect(url)
    try:
        await conn.execute("DELETE FROM minion_migrations")
        await conn.execute("INSERT INTO minion_migrations (name, checksum) VALUES ('001_tables.sql', 'x'), "
                           "('402_verify_task.sql', 'y')")
        with pytest.raises(MigrationError, match=r"402_verify_task\.sql.*build a new database"):
            await migrate(url)
        assert await conn.fetchval("SELECT count(*) FROM minion_migrations") == 2
    finally:
        await conn.close()


def test_each_function_view_and_trigger_is_written_once_in_the_schema() -> None:
    """The schema states every object once, in today's form: no CREATE OR REPLACE restating an
    earlier text, no ALTER FUNCTION or DROP beside it. Overloads share a name with other arguments;
    they are counted against the catalog by the test above (one schema text a function)."""
    seen: dict[tuple[str, str], list[str]] = {}
    for path in sorted((REPO / "sql" / "schema").glob("*.sql")):
        text = path.read_text()
        assert not re.search(r"^\s*(CREATE\s+OR\s+REPLACE|ALTER\s+FUNCTION|DROP\s+(FUNCTION|VIEW|TRIGGER|INDEX))",
                             text, re.IGNORECASE | re.MULTILINE), path.name
        for kind, name in _CREATE.findall(text):
            seen.setdefault((kind.split()[-1].upper(), name), []).append(path.name)
    overloads = {("FUNCTION", "minion_openai_add_file"), ("FUNCTION", "minion_reclaim_executor"),
                 ("FUNCTION", "minion_reclaim_expired")}
    assert {k: v for k, v in seen.items() if len(v) > 1 and k not in overloads} == {}
    assert all(len(seen[k]) == 2 for k in overloads)


def test_one_function_creates_every_task() -> None:
    """A submission, an OpenAI batch or request and a verification all create their task through
    minion_create_task: no other function of the schema inserts into tasks."""
    schema = "".join(path.read_text() for path in sorted((REPO / "sql" / "schema").glob("*.sql")))
    inserting = set()
    for piece in re.split(r"^(?=CREATE FUNCTION )", schema, flags=re.MULTILINE)[1:]:
        if re.search(r"\bINSERT\s+INTO\s+tasks\b", piece, re.IGNORECASE):
            inserting.add(piece.split("(", 1)[0].removeprefix("CREATE FUNCTION ").strip())
    assert inserting == {"minion_create_task"}


async def test_every_function_of_the_database_has_one_text_in_the_schema(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        in_catalog = await conn.fetchval("SELECT count(*) FROM pg_proc WHERE pronamespace = 'public'::regnamespace")
    finally:
        await conn.close()
    texts = sum(len(re.findall(r"^CREATE\s+FUNCTION\s", p.read_text(), re.MULTILINE))
                for p in (REPO / "sql" / "schema").glob("*.sql"))
    assert texts == in_catalog
