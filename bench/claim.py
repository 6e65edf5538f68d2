"""The claim under contention: our `minion_claim` (SKIP LOCKED selection plus the referee insert into
minion_subtask_acquirement) against a plain `FOR UPDATE SKIP LOCKED` claim, side by side.

    python bench/claim.py [--clients 1,4,8,16] [--subtasks 20000] [--runs 5] [--seconds 5]
    python bench/claim.py --fair-share [--teams 100] [--max 1,10] [--explain] [--clients ...] ...

(The second: the claim the API runs with one team pending against many; see bench/claim_teams.py.)

It starts its own embedded PostgreSQL 18 (default settings; `--fsync-off` adds fsync=off, for both
arms alike), migrates a template database, fills it with a queue of pending subtasks and one
executor per client, then for each client count runs (a) ours and (b) the reference alternately,
ABAB..., each run on a fresh copy of the template (CREATE DATABASE ... TEMPLATE), so every run
starts from the same full queue and no executor holds leases from an earlier run. Claims are
leases that are never completed: the queue drains while we measure.

Each client is one asyncpg connection driven by an asyncio task; the clients run in worker
processes (`--procs`, default: one process per 4 clients) forked for each run, so the Python side
is not the bottleneck (measured: no worker above a quarter of a core, even with four clients in one
process, so one process would do too). The output shows each worker's CPU use in the window.

Diagnostics: `--waits` samples pg_stat_activity every 20 ms and prints what the backends waited on,
per arm; `--no-heartbeat-notify` disables the heartbeats NOTIFY trigger in the benchmark's own
database (both arms), to see the claim without the cluster-wide lock a NOTIFYing commit holds.

After every run it checks that no subtask was leased twice: every claim the clients received is a
distinct subtask with a distinct token, the database's leased subtasks are exactly those, each
was leased once (attempts = 1), and, for every arm but the reference, the referee table holds
exactly one row per leased subtask carrying the same token and executor.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench import claim_teams  # noqa: E402
from bench.claim_clients import RunResult, pct, run_clients, verify  # noqa: E402
from bench.machine import cpu_model  # noqa: E402
from bench.scratch import admin  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres, bin_path  # noqa: E402
from minions.testing.factories import make_executor, make_task, make_token  # noqa: E402

TEMPLATE = "bench_claim_template"
LEASE_TIMEOUT_S = 60

OURS_SQL = f"SELECT * FROM minion_claim($1, {LEASE_TIMEOUT_S})"
REFERENCE_SQL = f"SELECT * FROM bench_claim_skip_locked($1, {LEASE_TIMEOUT_S})"

# The yardstick: the textbook SKIP LOCKED claim over the same table and index (subtasks_pending_queue),
# plus the same heartbeat touch and the same returned row as minion_claim, so the work per claim is
# comparable. It lives here, not in sql/: it is only a reference for this benchmark.
REFERENCE_FUNCTION = """
CREATE FUNCTION bench_claim_skip_locked(p_executor uuid, p_lease_timeout_s double precision)
RETURNS TABLE (lease_token uuid, expires_at timestamptz, task_id bigint, subtask_id integer,
               attempt integer, team text, project text, task_name text, kind text, model text,
               params jsonb, input_uri text, byte_start bigint, byte_end bigint, records integer,
               output_key text)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    won subtasks%ROWTYPE;
BEGIN
    UPDATE subtasks
       SET state = 'leased', lease_token = gen_random_uuid(), lease_executor = p_executor,
           leased_at = now(), attempts = attempts + 1
     WHERE (task_id, subtask_id) = (
           SELECT s.task_id, s.subtask_id FROM subtasks s
            WHERE s.state = 'pending' AND s.capability = 'sleep:*'
            ORDER BY s.priority DESC, s.task_id, s.subtask_id
            LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING * INTO won;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM minion_seen(p_executor);
    RETURN QUERY
    SELECT won.lease_token, now() + make_interval(secs => p_lease_timeout_s), won.task_id,
           won.subtask_id, won.attempts, won.team::text, won.project::text, won.task_name::text,
           t.kind, t.model, t.params, t.input_uri, won.byte_start, won.byte_end, won.records,
           minion_output_key(won.task_id, won.subtask_id, won.attempts, won.lease_token)
      FROM tasks t WHERE t.id = won.task_id;
END $$;
"""

ARMS = {"ours": OURS_SQL, "reference": REFERENCE_SQL}


# --- the database ---------------------------------------------------------------------------------------


async def prepare_template(server: EmbeddedPostgres, subtasks: int, per_task: int,
                           executors: int, heartbeat_notify: bool) -> list[uuid.UUID]:
    await admin(server.url, f"DROP DATABASE IF EXISTS {TEMPLATE}", f"CREATE DATABASE {TEMPLATE}")
    url = server.url_for(TEMPLATE)
    await migrate(url)
    conn = await connect(url)  # the project's jsonb codec, which the factories rely on
    try:
        await conn.execute(REFERENCE_FUNCTION)
        if not heartbeat_notify:
            # Diagnostic only, in this benchmark's own copy: every claim touches the heartbeat row,
            # whose trigger NOTIFYs; a NOTIFYing transaction holds a cluster-wide lock from just
            # before its commit until after it, so such commits are serialised (no group commit).
            await conn.execute("ALTER TABLE heartbeats DISABLE TRIGGER heartbeats_notify")
        left, n = subtasks, 0
        while left > 0:
            size = min(per_task, left)
            await make_task(conn, name=f"bench-{n}", subtasks=size)
            left -= size
            n += 1
        _, token_id = await make_token(conn, "executor")
        ids = [await make_executor(conn, token_id, name=f"bench-ex-{i}") for i in range(executors)]
        caps = await conn.fetchval("SELECT capabilities FROM executors WHERE id = $1", ids[0])
        assert caps == ["sleep:*"], caps
        pending = await conn.fetchval("SELECT count(*) FROM subtasks WHERE state = 'pending'")
        assert pending == subtasks, pending
    finally:
        await conn.close()
    # A settled starting point for every run: statistics and the visibility map as after a quiet spell.
    await admin(url, "VACUUM ANALYZE")
    await admin(server.url, f"ALTER DATABASE {TEMPLATE} WITH ALLOW_CONNECTIONS false")
    return ids


async def server_settings(url: str) -> dict[str, str]:
    conn = await asyncpg.connect(url)
    try:
        names = ["server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections",
                 "wal_level", "full_page_writes", "default_transaction_isolation"]
        return {n: await conn.fetchval(f"SHOW {n}") for n in names}
    finally:
        await conn.close()


# --- reporting ------------------------------------------------------------------------------------------


def summary_table(results: list[RunResult], clients: list[int]) -> str:
    lines = [
        "| clients | ours claims/s (median) | SKIP LOCKED claims/s (median) | ours / ref | "
        "ours p50 / p99 ms | ref p50 / p99 ms | ours runs | ref runs | client CPU max |",
        "|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for c in clients:
        row = {}
        for arm in ARMS:
            rs = [r for r in results if r.clients == c and r.arm == arm]
            lat = [x for r in rs for x in r.latencies]
            row[arm] = (
                statistics.median(r.rate for r in rs),
                pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3,
                ", ".join(f"{r.rate:.0f}{'!' if r.drained else ''}" for r in rs),
                max(x for r in rs for x in r.cpu),
            )
        o, f = row["ours"], row["reference"]
        lines.append(
            f"| {c} | {o[0]:.0f} | {f[0]:.0f} | {o[0] / f[0]:.2f} | {o[1]:.2f} / {o[2]:.2f} | "
            f"{f[1]:.2f} / {f[2]:.2f} | {o[3]} | {f[3]} | {max(o[4], f[4]) * 100:.0f}% |"
        )
    return "\n".join(lines)


# --- main -----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--clients", default="1,4,8,16", help="client counts, comma-separated")
    p.add_argument("--subtasks", type=int, default=20000, help="pending subtasks at the start of each run")
    p.add_argument("--per-task", type=int, default=5000, help="subtasks per task (the queue is several tasks)")
    p.add_argument("--runs", type=int, default=5, help="runs of each arm per client count (ABAB...)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each window")
    p.add_argument("--procs", default="auto",
                   help="client processes per run: a number, or auto (one per 4 clients)")
    p.add_argument("--fsync-off", action="store_true", help="run the server with fsync=off (both arms)")
    p.add_argument("--no-heartbeat-notify", action="store_true",
                   help="diagnostic: disable the heartbeats NOTIFY trigger in the benchmark's database "
                        "(both arms), to see the claim without the cluster-wide NOTIFY commit lock")
    p.add_argument("--waits", action="store_true",
                   help="also sample pg_stat_activity every 20 ms: what the backends wait on, per arm")
    p.add_argument("--keep", action="store_true", help="leave the server running and its data in place")
    p.add_argument("--fair-share", action="store_true",
                   help="instead of the arms above: minion_claim_batch with one team pending against --teams "
                        "teams pending, and the cost of one negotiation (bench/claim_teams.py)")
    p.add_argument("--teams", type=int, default=100, help="--fair-share: teams (and tasks) of the many-teams arm")
    p.add_argument("--max", default="1,10", help="--fair-share: the claims' p_max, comma-separated")
    p.add_argument("--cycle-calls", type=int, default=21, help="--fair-share: negotiations timed per arm")
    p.add_argument("--explain", action="store_true",
                   help="--fair-share: also print the costliest statements inside one claim of each arm")
    p.add_argument("--negotiate-every", type=float, default=1.0,
                   help="--fair-share: seconds between the negotiations beside a run, as the watchdog's "
                        "MINIONS_FAIR_SHARE_INTERVAL_S (0: only the one before it)")
    p.add_argument("--statements", action="store_true",
                   help="--fair-share: count every statement (pg_stat_statements, track = all; the server "
                        "restarts) and print, per lease, each arm's costliest beside the other's")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clients = [int(x) for x in args.clients.split(",") if x.strip()]
    root = Path(tempfile.mkdtemp(prefix="minions-bench-claim-"))
    server = EmbeddedPostgres(root / "pgdata", fast=args.fsync_off)
    t_begin = time.monotonic()
    results: list[RunResult] = []
    try:
        server.start()
        settings = asyncio.run(server_settings(server.url))
        if args.fair_share:
            print(f"# fair share's cost to a claim: {platform.node()}, nproc={os.cpu_count()}, {cpu_model()}; "
                  f"PostgreSQL {settings['server_version']} embedded, "
                  f"{'fsync=off' if args.fsync_off else 'default settings'}")
            claim_teams.run(server, args, clients)
            print(f"\n# total {time.monotonic() - t_begin:.0f} s; "
                  f"command: python bench/claim.py {' '.join(argv if argv is not None else sys.argv[1:])}")
            return 0
        print(f"# claim under contention: {platform.node()}, nproc={os.cpu_count()}, {cpu_model()}")
        print(f"# PostgreSQL {settings.pop('server_version')} embedded ({bin_path('postgres')}), "
              f"{'fsync=off (both arms)' if args.fsync_off else 'default settings'} + max_connections=300: "
              + ", ".join(f"{k}={v}" for k, v in settings.items()))
        print(f"# queue: {args.subtasks} pending subtasks in tasks of {args.per_task}, capability sleep:*; "
              f"{args.runs} runs x {args.seconds:g} s (+{args.warmup:g} s warm-up) per arm, ABAB, "
              "fresh copy of the template per run; heartbeats NOTIFY trigger "
              f"{'DISABLED (diagnostic)' if args.no_heartbeat_notify else 'on (the schema as is)'}")
        executors = asyncio.run(prepare_template(server, args.subtasks, args.per_task, max(clients),
                                                 not args.no_heartbeat_notify))
        for c in clients:
            procs = max(1, math.ceil(c / 4)) if args.procs == "auto" else max(1, min(c, int(args.procs)))
            print(f"\n## {c} client(s), {procs} client process(es)")
            waits: dict[str, dict[str, int]] = {arm: {} for arm in ARMS}
            for run in range(args.runs):
                for arm, sql in ARMS.items():
                    db = f"bench_run_{c}_{run}_{arm}"
                    asyncio.run(admin(server.url, f"DROP DATABASE IF EXISTS {db}",
                                      f"CREATE DATABASE {db} TEMPLATE {TEMPLATE}"))
                    url = server.url_for(db)
                    rs, _ = run_clients(url, sql, executors[:c], procs, args.warmup, args.seconds,
                                        waits[arm] if args.waits else None)
                    leases, pending = asyncio.run(verify(url, arm, rs))
                    asyncio.run(admin(server.url, f"DROP DATABASE {db}"))
                    r = RunResult(arm, c, sum(x.measured for x in rs) / args.seconds,
                                  [x for w in rs for x in w.latencies], [w.cpu_s / args.seconds for w in rs],
                                  any(w.drained for w in rs), leases)
                    results.append(r)
                    late = " (a worker connected late)" if any(w.late for w in rs) else ""
                    drained = ""
                    if r.drained:
                        drained = (f" A CLAIM RETURNED NOTHING with {pending} subtasks still pending" if pending
                                   else " QUEUE DRAINED: raise --subtasks")
                    print(f"run {run + 1} {arm:>9}: {r.rate:7.0f} claims/s  p50 {pct(r.latencies, .5) * 1e3:6.2f} ms"
                          f"  p99 {pct(r.latencies, .99) * 1e3:6.2f} ms  client CPU "
                          f"{'/'.join(f'{x * 100:.0f}%' for x in r.cpu)}  verified: {leases} leases, "
                          f"each subtask once{late}{drained}", flush=True)
            if args.waits:
                for arm, counts in waits.items():
                    total = sum(counts.values()) or 1
                    top = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
                    print(f"   waits {arm:>9}: " + ", ".join(f"{k} {n * 100 / total:.0f}%" for k, n in top))
        print(f"\n# total {time.monotonic() - t_begin:.0f} s; "
              f"command: python bench/claim.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
        print(summary_table(results, clients))
        if any(r.drained for r in results):
            print("\n(!) a claim found nothing during that run (see its line): its rate is a lower bound")
        return 0
    finally:
        if args.keep:
            print(f"server left running: {server.url} (data in {root})")
        else:
            server.stop(mode="immediate")
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
