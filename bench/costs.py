"""What one subtask and one heartbeat cost the database: the per-operation figures docs/SCALE.md
takes to fleet scale.

    python bench/costs.py [--subtasks 2000] [--records-per-subtask 50] [--executors 10] [--heartbeats 2000]

On an embedded PostgreSQL of its own (defaults, plus pg_stat_statements), with the real API,
splitter and watchdog as processes and in-process test executors speaking the HTTP protocol:

1. subtasks: one task of `--subtasks` subtasks (`--records-per-subtask` records of {"ms": 0}
   each) submitted, split, claimed, completed. Everything from submit to finish, divided by the
   subtasks: statements the services sent (pg_stat_statements, top level: round trips), WAL bytes
   (pg_current_wal_lsn before and after), rows inserted/updated/deleted (pg_stat_database) and
   NOTIFYs (a LISTEN connection on every channel the schema notifies on).
2. heartbeats: every executor holds one lease of a long subtask; `--heartbeats` heartbeats are
   sent (each naming its one lease), and the same four figures are divided by them.
0. idle (first, on a fresh database): the executors long-poll with nothing to do for `--idle-s`
   seconds: the same figures per second.

Figures are counts and bytes, not times: they do not depend on how busy the machine is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import asyncpg  # noqa: E402

from bench import statements  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402
from minions.sdk import MinionsClient  # noqa: E402
from minions.testing.factories import make_tokens  # noqa: E402
from minions.testing.processes import Services  # noqa: E402
from minions.testing.sleep_executor import SleepExecutor  # noqa: E402

CHANNELS = ("tasks", "subtasks", "heartbeats", "tokens")
SNAPSHOT = """
SELECT pg_current_wal_lsn() AS lsn,
       (SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
         WHERE d.datname = current_database() AND s.query NOT ILIKE '%pg_stat%'
           AND s.query NOT ILIKE '%pg_current_wal_lsn%') AS statements,
       (SELECT tup_inserted FROM pg_stat_database WHERE datname = current_database()) AS inserted,
       (SELECT tup_updated FROM pg_stat_database WHERE datname = current_database()) AS updated,
       (SELECT tup_deleted FROM pg_stat_database WHERE datname = current_database()) AS deleted
"""


class Meter:
    """Counts between `start()` and `stop()`: statements, WAL bytes, rows, NOTIFYs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.notifies: dict[str, int] = dict.fromkeys(CHANNELS, 0)
        self.conn: asyncpg.Connection | None = None
        self.before: Any = None
        self.at = 0.0
        self.seconds = 0.0  # between the last two snapshots
        self.top: list[tuple[float, str]] = []  # the most frequent statements, per unit

    async def open(self) -> None:
        self.conn = await connect(self.url)
        for channel in CHANNELS:
            await self.conn.add_listener(channel, self._heard)

    def _heard(self, _conn: object, _pid: int, channel: str, _payload: str) -> None:
        self.notifies[channel] += 1

    async def _snapshot(self) -> Any:
        assert self.conn is not None
        # pg_stat_database is updated when a backend reports (at most every second, and at idle).
        await asyncio.sleep(1.2)
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await self.conn.fetchrow(SNAPSHOT)
        self.at = time.monotonic()
        return row

    async def start(self) -> None:
        assert self.conn is not None
        await self.conn.execute("SELECT pg_stat_statements_reset()")
        self.before = await self._snapshot()
        self.notifies = dict.fromkeys(CHANNELS, 0)

    async def stop(self, per: int) -> dict[str, float]:
        assert self.conn is not None
        await asyncio.sleep(0.5)  # the last NOTIFYs
        notifies = dict(self.notifies)
        started = self.at
        after = await self._snapshot()
        self.seconds = self.at - started
        wal = await self.conn.fetchval("SELECT pg_wal_lsn_diff($1, $2)", after["lsn"], self.before["lsn"])
        figures = {
            "statements": (after["statements"] - self.before["statements"]) / per,
            "wal_bytes": float(wal) / per,
            "rows_inserted": (after["inserted"] - self.before["inserted"]) / per,
            "rows_updated": (after["updated"] - self.before["updated"]) / per,
            "rows_deleted": (after["deleted"] - self.before["deleted"]) / per,
        }
        figures |= {f"notify_{c}": n / per for c, n in notifies.items()}
        self.top = [(r["calls"] / per, " ".join(r["query"].split())[:90]) for r in await self.conn.fetch(
            """SELECT calls, query FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                WHERE d.datname = current_database() AND query NOT ILIKE '%pg_stat%'
                ORDER BY calls DESC LIMIT 8""")]
        return figures


async def _start_server(root: Path) -> tuple[EmbeddedPostgres, str]:
    server = EmbeddedPostgres(root / "pgdata")
    server.start()
    await statements.enable(server, track="top")
    conn = await asyncpg.connect(server.url)
    try:
        await conn.execute("CREATE DATABASE costs")
    finally:
        await conn.close()
    url = server.url_for("costs")
    await migrate(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    finally:
        await conn.close()
    return server, url


async def _wait_finished(client: MinionsClient, name: str) -> None:
    finished = asyncio.Event()
    while not finished.is_set():
        if (await client.task("bench", "costs", name))["finished_at"]:
            finished.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), 0.3)


async def run(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    root = Path(tempfile.mkdtemp(prefix="minions-costs-"))
    server, url = await _start_server(root)
    services = Services(url, root / "services", heartbeat_interval_s=5.0, lease_timeout_s=60.0, long_poll_s=5.0)
    results: dict[str, dict[str, float]] = {}
    try:
        admin, executor_token = await make_tokens(url)
        await services.start_all()
        client = MinionsClient(services.api_url, admin)
        meter = Meter(url)
        await meter.open()
        executors = [SleepExecutor(services.api_url, executor_token, f"cost-{i}") for i in range(args.executors)]
        async with aiohttp.ClientSession() as session:
            for e in executors:
                await e.register(session)

        # 3. Idle: everyone long-polls, nothing to do.
        stop = asyncio.Event()
        await meter.start()
        runs = [asyncio.create_task(e.run(stop, wait_s=5)) for e in executors]
        await asyncio.sleep(args.idle_s)
        stop.set()
        await asyncio.gather(*runs, return_exceptions=True)
        idle = await meter.stop(1)
        results["idle_per_second"] = {k: v / meter.seconds for k, v in idle.items()}
        tops = {"idle_per_second": [(n / meter.seconds, q) for n, q in meter.top]}

        # 1. Subtasks, submit to finish.
        stop = asyncio.Event()
        per = args.records_per_subtask
        records = [{"id": f"r{i:07d}", "ms": 0} for i in range(args.subtasks * per)]
        await meter.start()
        started = time.monotonic()
        runs = [asyncio.create_task(e.run(stop, wait_s=5)) for e in executors]
        await client.submit({"team": "bench", "project": "costs", "name": "subtasks", "kind": "sleep",
                             "input": {"records": records}, "subtask_size": per})
        await _wait_finished(client, "subtasks")
        print(f"subtasks: {args.subtasks} done in {time.monotonic() - started:.1f} s", file=sys.stderr)
        stop.set()
        await asyncio.gather(*runs, return_exceptions=True)
        results["per_subtask"] = await meter.stop(args.subtasks)
        tops["per_subtask"] = meter.top
        assert meter.conn is not None
        await meter.conn.execute("VACUUM ANALYZE subtasks, subtask_attempts")
        stored = await meter.conn.fetchval(
            """SELECT sum(pg_total_relation_size(c))
                 FROM unnest(ARRAY['subtasks', 'subtask_attempts']::regclass[]) c""")
        results["per_subtask"]["stored_bytes"] = float(stored) / args.subtasks

        # 2. Heartbeats: one long lease each, then heartbeats naming it.
        long = [{"id": f"h{i}", "ms": 600_000} for i in range(len(executors))]
        await client.submit({"team": "bench", "project": "costs", "name": "heartbeats", "kind": "sleep",
                             "input": {"records": long}, "subtask_size": 1})
        async with aiohttp.ClientSession() as session:
            tokens: dict[str, str] = {}
            for e in executors:
                while e.executor_id not in tokens:
                    async with session.post(f"{services.api_url}/api/v1/executors/{e.executor_id}/claim",
                                            params={"wait": "5"}, headers=e._headers()) as resp:
                        if resp.status == 200:
                            tokens[e.executor_id] = (await resp.json())["lease"]["token"]
            await meter.start()
            for i in range(args.heartbeats):
                e = executors[i % len(executors)]
                async with session.post(f"{services.api_url}/api/v1/executors/{e.executor_id}/heartbeat",
                                        json={"leases": [tokens[e.executor_id]]}, headers=e._headers()) as resp:
                    assert resp.status == 200, await resp.text()
            results["per_heartbeat"] = await meter.stop(args.heartbeats)
            tops["per_heartbeat"] = meter.top
        await client.cancel("bench", "costs", "heartbeats")
        await client.close()
        assert meter.conn is not None
        await meter.conn.close()
    finally:
        services.stop_all()
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
    for section, top in tops.items():
        print(f"most frequent statements, {section}:", file=sys.stderr)
        for calls, query in top:
            print(f"  {calls:8.2f}  {query}", file=sys.stderr)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--subtasks", type=int, default=2000)
    parser.add_argument("--records-per-subtask", type=int, default=50)
    parser.add_argument("--executors", type=int, default=10)
    parser.add_argument("--heartbeats", type=int, default=2000)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(f"per subtask of {args.records_per_subtask} records ({args.subtasks} subtasks, {args.executors} executors):")
    for section, figures in results.items():
        print(f"  {section}:")
        for key, value in figures.items():
            print(f"    {key:<18} {value:10.2f}")


if __name__ == "__main__":
    main()
