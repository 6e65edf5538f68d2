"""Draining a queue of one-record sleep subtasks, every arm in one run on one embedded PostgreSQL
(issue 11 "Must show"), alternating arm by arm, medians of the runs:

    python bench/drain.py [--subtasks 20000] [--clients 16] [--runs 3] [--arms ...]

Arms (each run on a fresh database cloned from a migrated template, so every arm starts alike):
  sql-baseline  direct SQL, `--clients` connections looping minion_claim + minion_complete, with the
                task-progress functions as shipped at b1943b0 (bench/baseline_b1943b0.sql, applied
                over the schema in the scratch database): every complete updates the task's row.
  sql-new       the same loop with the functions of this tree (sql/180_task_progress_slots.sql).
  pgq-batch10   PgQueuer 1.6 (`pip install -e .[bench]`): `--clients` QueueManagers, one
                connection each, drain no-op jobs with batch_size=10.
  pgq-batch1    the same, batch_size=1 (unbatched).
  latency       submit -> first lease, direct SQL: minion_submit_task of a one-record task split
                in its transaction, an idle executor woken by the 'subtasks' NOTIFY claims it;
                beside PgQueuer's enqueue -> entrypoint start (`--latency` samples each).
  http-*        not in this script yet: they need the batched protocol (k2-protocol) and services;
                printed as skipped with the reason.

The figure is subtasks (jobs) per second from the first claim to the last complete. The direct SQL
arms then check the end state: every subtask done once, and the task completed exactly once
(running the splitter's settle sweep, as the splitter would on the tail's NOTIFY).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench.claim import admin  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402
from minions.testing.factories import make_executor, make_task, make_token  # noqa: E402

BASELINE_SQL = Path(__file__).resolve().parent / "baseline_b1943b0.sql"
TEMPLATE = "bench_drain_template"
ALL_ARMS = ("sql-baseline", "sql-new", "pgq-batch10", "pgq-batch1", "http-unbatched", "http-batch10")


async def prepare_template(server: EmbeddedPostgres) -> None:
    await admin(server.url, f"DROP DATABASE IF EXISTS {TEMPLATE}", f"CREATE DATABASE {TEMPLATE}")
    await migrate(server.url_for(TEMPLATE))
    await admin(server.url, f"ALTER DATABASE {TEMPLATE} WITH ALLOW_CONNECTIONS false")


async def scratch(server: EmbeddedPostgres) -> tuple[str, str]:
    name = f"drain_{uuid.uuid4().hex[:8]}"
    await admin(server.url, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    return name, server.url_for(name)


# --- direct SQL ---------------------------------------------------------------------------------


async def sql_arm(url: str, subtasks: int, clients: int, baseline: bool) -> float:
    conn = await connect(url)
    if baseline:
        await conn.execute(BASELINE_SQL.read_text())
    _, token_id = await make_token(conn, "executor")
    executors = [await make_executor(conn, token_id, name=f"drain-{i}") for i in range(clients)]
    task_id = await make_task(conn, subtasks=subtasks)
    await conn.execute("VACUUM ANALYZE")
    conns = [await connect(url) for _ in range(clients)]

    async def drain(c: asyncpg.Connection, executor: uuid.UUID) -> None:
        while True:
            lease = await c.fetchrow("SELECT lease_token, records FROM minion_claim($1, 60)", executor)
            if lease is None:
                return
            answer = await c.fetchval("SELECT minion_complete($1, $2, 0.0)", lease["lease_token"], lease["records"])
            assert answer == "ok", answer

    start = time.perf_counter()
    await asyncio.gather(*(drain(c, e) for c, e in zip(conns, executors, strict=True)))
    elapsed = time.perf_counter() - start
    for c in conns:
        await c.close()
    # The end state: every subtask done once, the task completed once.
    for row in await conn.fetch("SELECT minion_settle_candidates(100) AS id"):
        await conn.fetchval("SELECT minion_settle_waiting($1)", row["id"])
    state = await conn.fetchrow(
        """SELECT t.status, (SELECT count(*) FROM subtasks WHERE task_id = t.id AND state = 'done') AS done,
                  (SELECT count(*) FROM subtask_attempts WHERE task_id = t.id) AS attempts
             FROM tasks t WHERE t.id = $1""", task_id)
    assert (state["status"], state["done"], state["attempts"]) == ("completed", subtasks, subtasks), dict(state)
    await conn.close()
    return subtasks / elapsed


# --- PgQueuer -----------------------------------------------------------------------------------


async def pgq_arm(url: str, jobs: int, clients: int, batch: int) -> float:
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    setup = await asyncpg.connect(url)
    queries = Queries(AsyncpgDriver(setup))
    await queries.install()
    for first in range(0, jobs, 5000):
        n = min(5000, jobs - first)
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    await setup.execute("VACUUM ANALYZE")
    done = 0

    conns = [await asyncpg.connect(url) for _ in range(clients)]
    managers = [QueueManager(Queries(AsyncpgDriver(c))) for c in conns]
    for qm in managers:
        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(qm.run(batch_size=batch, mode=QueueExecutionMode.drain,
                                  max_concurrent_tasks=max(2 * batch, 20)) for qm in managers))
    elapsed = time.perf_counter() - start
    for c in conns:
        await c.close()
    left = await setup.fetchval("SELECT count(*) FROM pgqueuer")
    await setup.close()
    assert done == jobs and left == 0, (done, left)
    return jobs / elapsed


# --- submit -> first lease --------------------------------------------------------------------


def _p50_p99(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s) * 1000, s[min(len(s) - 1, int(0.99 * len(s)))] * 1000


async def sql_submit_latency(url: str, n: int) -> list[float]:
    """Direct SQL: minion_submit_task of a one-record task split in its own transaction, until an
    idle executor (woken by the 'subtasks' NOTIFY, as the API's claim waiters are) holds its lease."""
    conn = await connect(url)
    _, token_id = await make_token(conn, "executor")
    executor = await make_executor(conn, token_id, name="latency")
    claimer = await connect(url)
    woken: asyncio.Queue[float] = asyncio.Queue()
    await claimer.add_listener("subtasks", lambda *_: woken.put_nowait(time.perf_counter()))
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await conn.fetchrow("SELECT id FROM minion_submit_task('search', 'p', $1, 'sleep', 'sleep', '{}', 0, 1, "
                            "NULL, 'file:///x.jsonl', 'h', NULL, '{0}', '{10}', '{0}', '{1}')", f"lat-{i}")
        await woken.get()
        lease = await claimer.fetchrow("SELECT lease_token FROM minion_claim($1, 60)", executor)
        samples.append(time.perf_counter() - start)
        assert lease is not None
        await claimer.fetchval("SELECT minion_complete($1, 1, 0.0)", lease["lease_token"])
    await claimer.close()
    await conn.close()
    return samples


async def pgq_start_latency(url: str, n: int) -> list[float]:
    """PgQueuer: enqueue one job until its entrypoint starts, a QueueManager idle on LISTEN."""
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    setup = await asyncpg.connect(url)
    queries = Queries(AsyncpgDriver(setup))
    await queries.install()
    worker_conn = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(worker_conn)))
    started: asyncio.Queue[float] = asyncio.Queue()

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        started.put_nowait(time.perf_counter())

    runner = asyncio.create_task(qm.run(batch_size=1))
    await asyncio.sleep(1.0)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        await queries.enqueue("noop", None)
        samples.append(await started.get() - start)
    qm.shutdown.set()
    await runner
    await worker_conn.close()
    await setup.close()
    return samples


async def latency_all(server: EmbeddedPostgres, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for arm, measure in (("submit-sql", sql_submit_latency), ("pgq-enqueue", pgq_start_latency)):
        if arm.startswith("pgq"):
            try:
                import pgqueuer  # noqa: F401
            except ImportError:
                continue
        name, url = await scratch(server)
        try:
            out[arm] = await measure(url, n)
        finally:
            await admin(server.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return out


# --- the run ------------------------------------------------------------------------------------


def arm_runner(arm: str, args: argparse.Namespace) -> Callable[[str], Awaitable[float]] | str:
    """The arm's measurement, or why it is skipped."""
    if arm == "sql-baseline":
        return lambda url: sql_arm(url, args.subtasks, args.clients, baseline=True)
    if arm == "sql-new":
        return lambda url: sql_arm(url, args.subtasks, args.clients, baseline=False)
    if arm.startswith("pgq-"):
        try:
            import pgqueuer  # noqa: F401
        except ImportError:
            return "PgQueuer is not installed (pip install -e '.[bench]')"
        batch = int(arm.removeprefix("pgq-batch"))
        return lambda url: pgq_arm(url, args.subtasks, args.clients, batch)
    return "HTTP arms are not in this script yet (services + the batched protocol of k2-protocol)"


async def run_all(server: EmbeddedPostgres, args: argparse.Namespace) -> dict[str, list[float]]:
    await prepare_template(server)
    runners = {arm: arm_runner(arm, args) for arm in args.arms}
    for arm, r in runners.items():
        if isinstance(r, str):
            print(f"# {arm}: skipped: {r}")
    rates: dict[str, list[float]] = {arm: [] for arm, r in runners.items() if not isinstance(r, str)}
    for run in range(args.runs):
        for arm in rates:
            runner = runners[arm]
            assert not isinstance(runner, str)
            name, url = await scratch(server)
            try:
                rate = await runner(url)
            finally:
                await admin(server.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            rates[arm].append(rate)
            print(f"run {run + 1} {arm:13s} {rate:9.0f} /s", flush=True)
    return rates


def table(rates: dict[str, list[float]]) -> str:
    medians = {arm: statistics.median(v) for arm, v in rates.items()}
    refs = {"sql-new": "sql-baseline", "pgq-batch1": "pgq-batch10", "sql-baseline": "pgq-batch10"}
    lines = ["| arm | per s (median) | runs | ratio |", "|---|---:|---|---|"]
    for arm, m in medians.items():
        ref = refs.get(arm)
        ratio = f"{m / medians[ref]:.2f}x {ref}" if ref in medians else ""
        if arm == "sql-new" and "pgq-batch10" in medians:
            ratio += f"; {m / medians['pgq-batch10']:.2f}x pgq-batch10"
        lines.append(f"| {arm} | {m:,.0f} | {', '.join(f'{x:.0f}' for x in rates[arm])} | {ratio} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subtasks", type=int, default=20000, help="subtasks (jobs) per run and arm")
    p.add_argument("--clients", type=int, default=16, help="connections (SQL) or QueueManagers (PgQueuer)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--arms", type=lambda s: [a for a in s.split(",") if a], default=list(ALL_ARMS),
                   help="comma-separated, of: " + ", ".join(ALL_ARMS))
    p.add_argument("--latency", type=int, default=200,
                   help="submit -> first lease samples (direct SQL) beside PgQueuer's enqueue -> start (0: skip)")
    p.add_argument("--fsync-off", action="store_true", help="fsync=off for every arm (default: on)")
    args = p.parse_args(argv)
    unknown = set(args.arms) - set(ALL_ARMS)
    if unknown:
        p.error(f"unknown arms: {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="minions-bench-drain-"))
    server = EmbeddedPostgres(root / "pgdata", fast=args.fsync_off)
    try:
        server.start()
        print(f"# drain: {platform.node()}, nproc={os.cpu_count()}; {args.subtasks} one-record subtasks, "
              f"{args.clients} clients, {args.runs} runs per arm alternating, "
              f"{'fsync=off' if args.fsync_off else 'fsync on'}")
        rates = asyncio.run(run_all(server, args))
        print()
        print(table(rates))
        if args.latency:
            lat = asyncio.run(latency_all(server, args.latency))
            print()
            print("| latency | p50 ms | p99 ms | p50 ratio |\n|---|---:|---:|---|")
            ref = _p50_p99(lat["pgq-enqueue"])[0] if "pgq-enqueue" in lat else None
            for arm, samples in lat.items():
                p50, p99 = _p50_p99(samples)
                ratio = f"{p50 / ref:.2f}x pgq-enqueue" if ref and arm != "pgq-enqueue" else ""
                print(f"| {arm} | {p50:.2f} | {p99:.2f} | {ratio} |")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
