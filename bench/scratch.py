"""A scratch PostgreSQL for one benchmark run: started in a fresh temporary folder (also the run's
work folder), stopped and removed afterwards, whatever happens; and `admin`, statements run on it
as its superuser (databases made and dropped, settings, extensions)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg

from minions.embedded_pg import EmbeddedPostgres


@contextlib.contextmanager
def scratch_postgres(prefix: str, *, fast: bool = False) -> Iterator[tuple[EmbeddedPostgres, Path]]:
    """(the started server, its temporary folder); `fast`: fsync off (figures that do not measure
    durability)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedPostgres(root / "pgdata", fast=fast)
    try:
        server.start()
        yield server, root
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def admin(url: str, *statements: str) -> None:
    """Each statement by itself, in turn, on a fresh connection to `url`: outside any transaction, as
    CREATE DATABASE and ALTER SYSTEM must run."""
    conn = await asyncpg.connect(url)
    try:
        for s in statements:
            await conn.execute(s)
    finally:
        await conn.close()
