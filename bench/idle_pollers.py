"""Statements an idle fleet costs the database (1,000 idle long-pollers; the target: at
most 1 statement per executor per long-poll cycle, none while waiting).

    python bench/idle_pollers.py [--executors 1000] [--wait-s 5] [--cycles 3]

One embedded PostgreSQL that logs every statement (`log_statement = all`, as
tests/api/test_idle_claims.py does), the real services (API with its default workers, splitter, watchdog
as processes) and `--executors` executors in this process: each registered, then long-polling
`POST /claim?wait=--wait-s&max=10` in a loop over one shared aiohttp session, with nothing pending.
After one warm-up cycle, over `--cycles` cycles (the window's ends taken on the server's clock), it
counts from the server's own statement log:

- claim statements (minion_claim_batch, the claim route's one statement per try), per executor
  per cycle, a cycle being the mean time between one executor's successive claims as the client saw
  it: 1.00 means one statement when a poll begins and none while it waits (the wait ends on a NOTIFY
  or the timeout, answered 204 without a second query). Per executor (the executor id is the
  statement's first parameter): the most any one executor ran in the window;
- every statement the database ran in the window: the claims plus the services' own background
  (splitter sweep, watchdog ticks, which do not grow with executors);
- claims answered other than 204 (none expected: nothing is pending).

The executors send no heartbeats here (one statement each per heartbeat interval, bench/costs.py);
the measurement ends well inside the lease timeout, so none is taken for lost.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import statistics
import sys
import time
import warnings
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench.drain import running_services  # noqa: E402
from bench.scratch import scratch_postgres  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402

# A logged statement: "2026-12-01 03:40:01.123 UTC [pid] LOG:  execute <name>: SELECT ..." (or
# "statement: ..."), the parameters on the DETAIL line that follows.
LOGGED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \S+ \[\d+\] LOG:\s+(?:statement|execute [^:]*): (.*)$")
FIRST_PARAMETER = re.compile(r"DETAIL:\s+Parameters: \$1 = '([^']*)'")


def logged_statements(log: Path, since: datetime, until: datetime) -> list[tuple[str, str | None]]:
    """(statement, its first parameter) of every statement logged in [since, until)."""
    found: list[tuple[str, str | None]] = []
    for line in log.read_text(errors="replace").splitlines():
        if (m := LOGGED.match(line)) is not None:
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
            found.append((m.group(2) if since <= at < until else "", None))  # "": outside the window
        elif found and found[-1][0] and (p := FIRST_PARAMETER.search(line)) is not None:
            found[-1] = (found[-1][0], p.group(1))
    return [f for f in found if f[0]]


async def register(session: aiohttp.ClientSession, api: str, token: str, i: int) -> str:
    async with session.post(f"{api}/api/v1/executors/register", headers={"Authorization": f"Bearer {token}"},
                            json={"name": f"idle-{i}", "hardware": {"os": "bench", "device": "cpu"},
                                  "kinds": ["sleep"]}) as reply:
        assert reply.status in (200, 201), (reply.status, await reply.text())
        return str((await reply.json())["executor_id"])


async def poll(session: aiohttp.ClientSession, api: str, token: str, executor_id: str, wait_s: float,
               stop: asyncio.Event, stats: dict[str, int], starts: list[float]) -> None:
    url = f"{api}/api/v1/executors/{executor_id}/claim?wait={wait_s}&max=10"
    while not stop.is_set():
        starts.append(time.monotonic())
        async with session.post(url, headers={"Authorization": f"Bearer {token}"}) as reply:
            await reply.read()
            stats[str(reply.status)] = stats.get(str(reply.status), 0) + 1


async def run(args: argparse.Namespace, server: EmbeddedPostgres) -> dict[str, Any]:
    await migrate(server.url)
    conn = await connect(server.url)
    await conn.execute("ALTER SYSTEM SET log_statement = 'all'")
    await conn.execute("SELECT pg_reload_conf()")
    # Every executor registers under one token, at once: its bounds (sql/schema/05_executors.sql) are raised to fit.
    env = {"MINIONS_MAX_CONNECTIONS_PER_IP": str(args.executors + 100), "MINIONS_LONG_POLL_S": str(args.wait_s),
           "MINIONS_MAX_EXECUTORS_PER_TOKEN": str(args.executors),
           "MINIONS_REGISTRATIONS_PER_MINUTE": str(args.executors)}
    async with running_services(server.url, args, **env) as (services, _admin, token), \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                  timeout=aiohttp.ClientTimeout(total=args.wait_s + 30)) as session:
        gate = asyncio.Semaphore(50)

        async def one(i: int) -> str:
            async with gate:
                return await register(session, services.api_url, token, i)

        started = time.monotonic()
        ids = await asyncio.gather(*(one(i) for i in range(args.executors)))
        print(f"# {len(ids)} executors registered in {time.monotonic() - started:.1f} s", flush=True)
        stop = asyncio.Event()
        stats: dict[str, int] = {}
        starts: dict[str, list[float]] = {e: [] for e in ids}
        pollers = [asyncio.create_task(poll(session, services.api_url, token, e, args.wait_s, stop, stats,
                                            starts[e])) for e in ids]
        await asyncio.sleep(args.wait_s + 1)  # one warm-up cycle: every executor waiting
        since = await conn.fetchval("SELECT clock_timestamp()")
        stats.clear()
        await asyncio.sleep(args.cycles * args.wait_s)
        until = await conn.fetchval("SELECT clock_timestamp()")
        answered = dict(stats)
        stop.set()
        await asyncio.gather(*pollers)
    await conn.close()
    logged = await asyncio.to_thread(logged_statements, server.log_file, since, until)
    claims = [param for text, param in logged if "minion_claim_batch" in text]
    per_executor = Counter(claims)
    gaps = [b - a for times in starts.values() for a, b in itertools.pairwise(times[1:])]
    cycle_s = statistics.mean(gaps)
    window = (until - since).total_seconds()
    cycles = window / cycle_s
    return {"executors": args.executors, "wait_s": args.wait_s, "cycle_s": cycle_s, "cycles": cycles,
            "window_s": window, "claim_statements": len(claims), "all_statements": len(logged),
            "answered": answered, "most_by_one": max(per_executor.values(), default=0),
            "spread": dict(sorted(Counter(per_executor.values()).items())),
            "executors_seen": len(per_executor),
            "claims_per_executor_cycle": len(claims) / args.executors / cycles,
            "statements_per_executor_cycle": len(logged) / args.executors / cycles}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--executors", type=int, default=1000)
    p.add_argument("--wait-s", type=float, default=5.0, help="the long poll's wait (the server's MINIONS_LONG_POLL_S)")
    p.add_argument("--cycles", type=int, default=3, help="long-poll cycles measured")
    p.add_argument("--api-workers", type=int, default=os.cpu_count() or 1, help="`minions api --workers`")
    args = p.parse_args(argv)
    with scratch_postgres("minions-bench-idle-") as (server, root):
        args.workdir = str(root)
        r = asyncio.run(run(args, server))
    print(f"{r['executors']} idle executors long-polling (wait {r['wait_s']:g} s; a cycle took {r['cycle_s']:.3f} s), "
          f"window {r['window_s']:.2f} s = {r['cycles']:.2f} cycles: claims answered {r['answered']}")
    print(f"  claim statements: {r['claim_statements']} = {r['claims_per_executor_cycle']:.3f} per executor per "
          f"cycle (target <= 1); the most any one executor ran: {r['most_by_one']} "
          f"({r['executors_seen']} executors seen; executors by statements run: {r['spread']})")
    print(f"  every statement the database ran: {r['all_statements']} = "
          f"{r['statements_per_executor_cycle']:.3f} per executor per cycle")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
