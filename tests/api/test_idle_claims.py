"""Invariant 6, second half: an idle system (no pending work, executors long-polling) issues no
polling queries. Checked in the server's own statement log, so nothing the API does is missed."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

from minions.db.migrate import migrate
from minions.embedded_pg import EmbeddedPostgres
from minions.testing.factories import make_task
from tests.support.api import running_api

STATEMENT = re.compile(r"LOG:\s+(statement|execute [^:]*):")


@contextlib.asynccontextmanager
async def _logging_postgres(tmp_path: Path) -> AsyncIterator[EmbeddedPostgres]:
    """A migrated PostgreSQL of its own that logs every statement."""
    pg = EmbeddedPostgres(tmp_path / "pg", fast=True)
    await asyncio.to_thread(pg.start)
    try:
        await migrate(pg.url)
        conn = await asyncpg.connect(pg.url)
        await conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        await conn.execute("SELECT pg_reload_conf()")
        await conn.close()
        yield pg
    finally:
        await asyncio.to_thread(pg.stop, "immediate")


def _statements(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if STATEMENT.search(line)]


async def test_waiting_claims_run_no_queries_until_work_appears(tmp_path: Path) -> None:
    async with _logging_postgres(tmp_path) as pg:
        async with running_api(pg.url, tmp_path / "store") as api:
            executors = [await api.register(f"idle-{i}") for i in range(5)]
            claims = [asyncio.create_task(api.call("POST", f"/api/v1/executors/{e}/claim?wait=20",
                                                   token="executor")) for e in executors]
            await asyncio.sleep(1.0)  # each has run its one claim query and is waiting
            before = len(await asyncio.to_thread(_statements, pg.log_file))
            await asyncio.sleep(3.0)
            during = (await asyncio.to_thread(_statements, pg.log_file))[before:]
            assert during == [], f"{len(during)} statements while idle, e.g. {during[:3]}"
            assert not any(c.done() for c in claims)

            # And work still wakes them at once.
            conn = await asyncpg.connect(pg.url)
            await make_task(conn, subtasks=5, input_uri=(tmp_path / "store" / "inputs" / "x.jsonl").as_uri())
            await conn.close()
            replies = await asyncio.wait_for(asyncio.gather(*claims), 5)
            assert sorted(r.status for r in replies) == [200] * 5


async def test_an_idle_long_poll_cycle_costs_one_statement(tmp_path: Path) -> None:
    """One statement per long-poll cycle (the fused claim), none while waiting, and no
    second claim when the wait times out (the answer is 204 from the wait)."""
    async with _logging_postgres(tmp_path) as pg:
        async with running_api(pg.url, tmp_path / "store") as api:
            executors = [await api.register(f"poller-{i}") for i in range(4)]
            # The token is looked up (and cached) by a first request.
            await api.call("POST", f"/api/v1/executors/{executors[0]}/heartbeat", token="executor")
            await asyncio.sleep(0.3)
            before = len(await asyncio.to_thread(_statements, pg.log_file))

            async def poll(executor: str) -> list[int]:
                return [(await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=0.4&max=4",
                                        token="executor")).status for _ in range(3)]

            statuses = await asyncio.gather(*(poll(e) for e in executors))
            await asyncio.sleep(0.3)
            during = (await asyncio.to_thread(_statements, pg.log_file))[before:]
        assert statuses == [[204] * 3] * 4
        # The pool's own reset on release (asyncpg's, minions/db/connect.py) is not a statement of
        # the claim: counted apart.
        claims = [line for line in during if "pg_advisory_unlock_all" not in line and "RESET ALL" not in line]
        assert len(claims) == 12, f"{len(claims)} statements for 12 cycles: {claims[:6]}"
        assert all("minion_claim_batch" in line for line in claims), claims[:6]
