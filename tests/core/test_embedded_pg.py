"""The embedded PostgreSQL of `minions up`: a password on TCP, data kept across restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from minions.embedded_pg import EmbeddedPostgres


async def test_password_required_and_data_survives_a_restart(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg", fast=True)
    await asyncio.to_thread(pg.start)
    try:
        conn = await asyncpg.connect(pg.url)
        await conn.execute("CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
        await conn.close()
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(f"postgresql://postgres:wrong@127.0.0.1:{pg.port}/postgres")
        await asyncio.to_thread(pg.stop, "immediate")
        again = EmbeddedPostgres(tmp_path / "pg", fast=True)  # a later `minions up`: same port, same data
        await asyncio.to_thread(again.start)
        assert again.port == pg.port and again.url == pg.url
        conn = await asyncpg.connect(again.url)
        assert await conn.fetchval("SELECT v FROM kept") == 7
        await conn.close()
    finally:
        await asyncio.to_thread(pg.stop, "immediate")
