"""Real PostgreSQL for tests: one embedded server per session (or MINIONS_TEST_DATABASE_URL), a
migrated template database, and a fresh clone of it per test (CREATE DATABASE ... TEMPLATE)."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import asyncpg

from minions.db.migrate import migrate
from minions.embedded_pg import EmbeddedPostgres

TEMPLATE = "minions_template"


class TestDatabases:
    """Hands out fresh, migrated databases on one server."""

    __test__ = False  # a helper, not a test class

    def __init__(self) -> None:
        self.server: EmbeddedPostgres | None = None
        self._root: Path | None = None
        external = os.environ.get("MINIONS_TEST_DATABASE_URL")
        if external:
            self.admin_url = external
        else:
            self._root = Path(tempfile.mkdtemp(prefix="minions-test-pg-"))
            self.server = EmbeddedPostgres(self._root / "pgdata", fast=True)
            self.server.start()
            self.admin_url = self.server.url
        self._counter = itertools.count()
        self._prefix = f"t{uuid.uuid4().hex[:6]}"
        self._created: list[str] = []
        self._finished: list[str] = []

    def url_for(self, database: str) -> str:
        base, _, _ = self.admin_url.rpartition("/")
        query = ""
        if "?" in self.admin_url:
            query = "?" + self.admin_url.split("?", 1)[1]
        return f"{base}/{database}{query}"

    async def prepare_template(self) -> None:
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}_{self._prefix}")
            await conn.execute(f"CREATE DATABASE {TEMPLATE}_{self._prefix}")
        finally:
            await conn.close()
        await migrate(self.url_for(f"{TEMPLATE}_{self._prefix}"))

    async def fresh(self) -> str:
        """A new database cloned from the migrated template."""
        return await self._create(f"TEMPLATE {TEMPLATE}_{self._prefix}")

    async def empty(self) -> str:
        """A new database with nothing in it (for tests of the migrator itself)."""
        return await self._create("")

    async def _create(self, options: str) -> str:
        await self._drop_finished()
        name = f"{self._prefix}_{next(self._counter)}"
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(f"CREATE DATABASE {name} {options}")
        finally:
            await conn.close()
        self._created.append(name)
        return self.url_for(name)

    def finished(self, url: str) -> None:
        """The test that had this database is over: it is dropped before the next one is made (by
        then every fixture of that test, in whatever order they were torn down, has stopped using
        it). A session of hundreds of tests would otherwise leave gigabytes of databases for the
        server's data folder to hold and for the session's end to delete."""
        self._finished.append(url.rsplit("/", 1)[1].split("?", 1)[0])

    async def _drop_finished(self) -> None:
        if not self._finished:
            return
        conn = await asyncpg.connect(self.admin_url)
        try:
            while self._finished:
                name = self._finished.pop()
                await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                self._created.remove(name)
        finally:
            await conn.close()

    async def drop_all(self) -> None:
        conn = await asyncpg.connect(self.admin_url)
        try:
            for name in [*self._created, f"{TEMPLATE}_{self._prefix}"]:
                await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()

    def stop(self) -> None:
        """Stops the embedded server and removes its data folder: a test session grows it to a few GB,
        and a machine that runs the suite often fills its disk with them otherwise."""
        try:
            if self.server is not None:
                self.server.stop(mode="immediate")
        finally:
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
