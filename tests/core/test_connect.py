"""The pool's release costs no round trip (minions/db/connect.py): no reset query runs, and a
transaction left open is still rolled back."""

from __future__ import annotations

from minions.db.connect import create_pool


async def test_release_runs_no_reset_query_but_rolls_back_an_open_transaction(database_url: str) -> None:
    pool = await create_pool(database_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            await conn.execute("SELECT set_config('application_name', 'kept-across-release', false)")
            before = conn._protocol.queries_count  # type: ignore[attr-defined]
        async with pool.acquire() as conn:
            # asyncpg's default reset would have run RESET ALL (one more statement, the name gone).
            assert conn._protocol.queries_count == before  # type: ignore[attr-defined]
            assert await conn.fetchval("SHOW application_name") == "kept-across-release"
            await conn.execute("BEGIN; CREATE TABLE pool_probe (x int)")  # left open, as by a crashed handler
            assert conn.is_in_transaction()
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT to_regclass('pool_probe')") is None
    finally:
        await pool.close()
