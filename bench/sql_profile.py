"""Where PostgreSQL spends its time on the per-subtask path: the lease functions' own (self) and total
time per subtask, from `pg_stat_user_functions` with `track_functions = all`, while `--clients`
direct-SQL clients drain one task of `--subtasks` one-record subtasks.

    python bench/sql_profile.py [--subtasks 10000] [--clients 16] [--batch 10]

`--batch 1`: each client loops minion_claim + minion_complete (the first protocol's steps);
`--batch N`: minion_claim_batch of N + minion_complete_batch of the leases won, in (task, subtask)
order, as the API runs them. Times are wall time inside each function summed over the backends
(lock waits and CPU contention included), divided by the subtasks: they add up to more than the
elapsed time, and they compare functions of one run with each other, not runs with each other.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench.drain import sql_drain  # noqa: E402
from bench.scratch import scratch_postgres  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.testing.factories import make_executor, make_task, make_token  # noqa: E402


async def run(url: str, args: argparse.Namespace) -> None:
    await migrate(url)
    conn = await connect(url)
    _, token_id = await make_token(conn, "executor")
    executors = [await make_executor(conn, token_id, name=f"profile-{i}") for i in range(args.clients)]
    await make_task(conn, subtasks=args.subtasks)
    await conn.execute("VACUUM ANALYZE")
    await conn.execute("SELECT pg_stat_reset()")
    clients = [await connect(url) for _ in range(args.clients)]
    for c in clients:
        await c.execute("SET track_functions = 'all'")
    started = time.perf_counter()
    done = await asyncio.gather(*(sql_drain(c, e, token_id, args.batch)
                                  for c, e in zip(clients, executors, strict=True)))
    elapsed = time.perf_counter() - started
    for c in clients:
        await c.close()  # a backend's counters reach the shared view when it exits
    await asyncio.sleep(1)
    rows = await conn.fetch("SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions "
                            "WHERE calls > 0 ORDER BY self_time DESC")
    await conn.close()
    n = sum(done)
    print(f"{n} subtasks, {args.clients} clients, batch {args.batch}: {elapsed:.2f} s = {n / elapsed:,.0f}/s")
    print("| function | calls | self us/subtask | total us/subtask |\n|---|---:|---:|---:|")
    for r in rows:
        self_us, total_us = r["self_time"] * 1000 / n, r["total_time"] * 1000 / n
        print(f"| {r['funcname']} | {r['calls']:,} | {self_us:.1f} | {total_us:.1f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subtasks", type=int, default=10000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--batch", type=int, default=10, help="1: minion_claim + minion_complete; N: the batched steps")
    args = p.parse_args(argv)
    with scratch_postgres("minions-bench-sqlprofile-") as (server, _root):
        asyncio.run(run(server.url, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
