"""The claim the API runs (`minion_claim_batch`) with one team pending against many teams pending:
what fair share's tier costs a claim. `python bench/claim.py --fair-share` runs it (see claim.py for
the server, claim_clients.py for the clients and the checks it shares).

Two arms over the same queue: `--subtasks` pending subtasks in `--teams` tasks of equal size, all of
one team (1team) or each task its own team (Nteams); the executors are shared (no team), one per
client. The watchdog's negotiation (minion_fair_share_cycle, with the watchdog's default settings)
runs on each fresh copy before the run, so the Nteams copy starts with a round of turns and the 1team
copy with none (a team alone has no turns), and once a second through the run from a side
connection, as the watchdog would (`--negotiate-every`; 0: only the one before). A round has
MINIONS_FAIR_SHARE_ROUND turns, 60 by default: with more teams than that, it names the 60 least
used, ties by name. For each batch size (`--max`) and client count the arms alternate (ABAB...),
each run on a fresh copy of its template; the figure is the median of the runs' leases per second,
and the ratio is the cost of a lease with N teams pending against one team's (1team's leases per
second / Nteams').

It also times one negotiation on a fresh copy of each template (N teams: the cost the watchdog pays
every second), with the statements inside it as auto_explain measures them, and with `--explain` the
statements inside one claim of each arm (the claim's connection warmed first, so its cached plans
are the ones a running API uses). `--statements` counts every statement of the runs
(pg_stat_statements, the statements inside functions too) and prints, per lease, each arm's
costliest beside the other's: execution time, buffers, WAL.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench import statements
from bench.claim_clients import RunResult, pct, run_clients, verify
from bench.scratch import admin
from minions.config import Settings
from minions.db.connect import connect
from minions.db.migrate import migrate
from minions.db.queries import Queries
from minions.embedded_pg import EmbeddedPostgres
from minions.testing.factories import make_executor, make_task, make_token

API = Queries("api")
WATCHDOG = Queries("watchdog")
_DEFAULTS = Settings()
CYCLE_ARGS = (_DEFAULTS.fair_share_half_life_s, _DEFAULTS.fair_share_round, _DEFAULTS.starvation_s)


def arm_names(teams: int) -> list[str]:
    return ["1team", f"{teams}teams"]


# --- the negotiation beside the clients ----------------------------------------------------------


async def _negotiate_every(url: str, go: float, end: float, interval: float) -> list[float]:
    """The watchdog's loop: one negotiation every `interval` seconds from go to end; returns each
    one's seconds."""
    took: list[float] = []
    conn = await asyncpg.connect(url, timeout=30)
    try:
        tick = go
        while tick < end:
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
            t0 = time.monotonic()
            await conn.fetchval(WATCHDOG.fair_share_cycle, *CYCLE_ARGS)
            took.append(time.monotonic() - t0)
            tick += interval
    finally:
        await conn.close()
    return took


def _negotiator(pipe: Any, url: str, go: float, end: float, interval: float) -> None:
    try:
        pipe.send(asyncio.run(_negotiate_every(url, go, end, interval)))
    except BaseException as e:  # reported to the parent, which fails the run
        pipe.send(f"{type(e).__name__}: {e}")
    pipe.close()


# --- the templates --------------------------------------------------------------------------------


async def prepare_template(server: EmbeddedPostgres, name: str, subtasks: int, tasks: int, teams: int,
                           executors: int) -> list[uuid.UUID]:
    """`subtasks` pending in `tasks` tasks of equal size, spread over `teams` teams in turn; shared
    executors (no team)."""
    await admin(server.url, f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
    url = server.url_for(name)
    await migrate(url)
    conn = await connect(url)
    try:
        per_task = subtasks // tasks
        for n in range(tasks):
            await make_task(conn, team=f"team-{n % teams:03d}", name=f"bench-{n}",
                            subtasks=per_task + (1 if n < subtasks % tasks else 0))
        _, token_id = await make_token(conn, "executor")
        ids = [await make_executor(conn, token_id, name=f"bench-ex-{i}") for i in range(executors)]
        row = await conn.fetchrow(
            "SELECT count(*) AS pending, count(DISTINCT team) AS teams FROM subtasks WHERE state = 'pending'")
        assert (row["pending"], row["teams"]) == (subtasks, teams), dict(row)
    finally:
        await conn.close()
    await admin(url, "VACUUM ANALYZE")
    await admin(server.url, f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")
    return ids


async def negotiate(url: str) -> tuple[int, int]:
    """One negotiation; returns the turns written and the teams they name."""
    conn = await asyncpg.connect(url)
    try:
        await conn.fetchval(WATCHDOG.fair_share_cycle, *CYCLE_ARGS)
        row = await conn.fetchrow("SELECT count(*) AS turns, count(DISTINCT team) AS teams FROM fair_share_turns")
        return row["turns"], row["teams"]
    finally:
        await conn.close()


async def wal_so_far(url: str) -> tuple[float, float]:
    """The cluster's WAL bytes and full-page images written so far (pg_stat_wal)."""
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow("SELECT wal_bytes::float8 AS wal, wal_fpi::float8 AS fpi FROM pg_stat_wal")
        return row["wal"], row["fpi"]
    finally:
        await conn.close()


async def leased_teams(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        n: int = await conn.fetchval("SELECT count(DISTINCT team) FROM subtasks WHERE state = 'leased'")
        return n
    finally:
        await conn.close()


# --- the statements inside one call (auto_explain, nested) ----------------------------------------


@dataclass
class Statement:
    ms: float
    text: str
    plan: str


_LOGGED = re.compile(r"duration: ([0-9.]+) ms\s+plan:\s*\n(.*)", re.DOTALL)


async def nested_statements(conn: asyncpg.Connection, sql: str, *args: Any) -> list[Statement]:
    """Runs sql once with auto_explain on every statement inside it (ANALYZE, its actual times);
    returns them as logged, innermost first."""
    logged: list[str] = []

    def listener(_conn: Any, message: Any) -> None:
        logged.append(message.message)

    await conn.execute("LOAD 'auto_explain'")
    await conn.execute("SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on; "
                       "SET auto_explain.log_nested_statements = on; SET auto_explain.log_timing = on; "
                       "SET client_min_messages = log")
    conn.add_log_listener(listener)
    try:
        await conn.fetch(sql, *args)
    finally:
        conn.remove_log_listener(listener)
        await conn.execute("SET auto_explain.log_min_duration = -1; SET client_min_messages = notice")
    out = []
    for text in logged:
        m = _LOGGED.search(text)
        if m:
            body = m.group(2)
            query = re.search(r"Query Text: (.*?)(?:\n\S|\Z)", body, re.DOTALL)
            out.append(Statement(float(m.group(1)), " ".join((query.group(1) if query else body).split()), body))
    return out


def print_statements(title: str, statements: list[Statement], top: int) -> None:
    total = statements[-1].ms if statements else 0.0
    print(f"   {title}: {total:.2f} ms in all; the costliest statements inside it (auto_explain, ANALYZE):")
    for s in sorted(statements[:-1], key=lambda s: -s.ms)[:top]:
        print(f"     {s.ms:8.3f} ms  {s.text[:150]}")


async def negotiation_cost(server: EmbeddedPostgres, template: str, calls: int) -> dict[str, Any]:
    """One negotiation's cost on a fresh copy of a template: `calls` of them timed from the client
    (median, the first apart: it creates the connection's plans), EXPLAIN ANALYZE's execution time of
    one, and the statements inside one."""
    db = f"{template}_cycle"
    await admin(server.url, f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db} TEMPLATE {template}")
    conn = await asyncpg.connect(server.url_for(db))
    try:
        took = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await conn.fetchval(WATCHDOG.fair_share_cycle, *CYCLE_ARGS)
            took.append(time.perf_counter() - t0)
        explained = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + WATCHDOG.fair_share_cycle, *CYCLE_ARGS)
        execution = next(float(r[0].split(":")[1].split()[0]) for r in explained
                         if r[0].startswith("Execution Time"))
        inside = await nested_statements(conn, WATCHDOG.fair_share_cycle, *CYCLE_ARGS)
        # What auto_explain does not show: the negotiation's scratch table, made and dropped each time
        # (utility statements are not planned), measured alone in a transaction of its own.
        scratch = []
        for _ in range(calls):
            t0 = time.perf_counter()
            async with conn.transaction():
                await conn.execute("CREATE TEMP TABLE IF NOT EXISTS bench_pairs (team text, capability text) "
                                   "ON COMMIT DROP; TRUNCATE bench_pairs")
            scratch.append(time.perf_counter() - t0)
        pending = await conn.fetchval("SELECT count(*) FROM subtasks WHERE state = 'pending'")
        turns = await conn.fetchval("SELECT count(*) FROM fair_share_turns")
    finally:
        await conn.close()
        await admin(server.url, f"DROP DATABASE {db}")
    return {"first_ms": took[0] * 1e3, "median_ms": statistics.median(took[1:]) * 1e3,
            "min_ms": min(took[1:]) * 1e3, "explain_ms": execution, "inside": inside, "pending": pending,
            "turns": turns, "scratch_ms": statistics.median(scratch) * 1e3}


async def claim_statements(server: EmbeddedPostgres, template: str, executor: uuid.UUID, p_max: int,
                           warm: int) -> list[Statement]:
    """The statements inside one claim on a fresh, negotiated copy, after `warm` claims on the same
    connection (the API's connections keep their plans)."""
    db = f"{template}_explain"
    await admin(server.url, f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db} TEMPLATE {template}")
    url = server.url_for(db)
    await negotiate(url)
    conn = await asyncpg.connect(url)
    try:
        for _ in range(warm):
            await conn.fetch(API.claim_batch, executor, None, p_max, 0.0)
        return await nested_statements(conn, API.claim_batch, executor, None, p_max, 0.0)
    finally:
        await conn.close()
        await admin(server.url, f"DROP DATABASE {db}")


# --- where a run's time went (pg_stat_statements, --statements) ----------------------------------


RUN_STATEMENTS = """
SELECT toplevel, left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query, calls, total_exec_time AS ms,
       shared_blks_hit + shared_blks_read AS blocks, shared_blks_dirtied AS dirtied, wal_fpi AS fpi,
       wal_bytes::float8 AS wal
  FROM pg_stat_statements
 WHERE calls > 0 AND dbid = (SELECT oid FROM pg_database WHERE datname = $1)
"""
COUNTS = ("calls", "ms", "blocks", "dirtied", "fpi", "wal")


async def run_statements(server: EmbeddedPostgres, db: str) -> dict[tuple[bool, str], list[float]]:
    """What one run's database counted (statements inside functions too), by statement."""
    conn = await asyncpg.connect(server.url)
    try:
        rows = await conn.fetch(RUN_STATEMENTS, db)
        return {(r["toplevel"], r["query"]): [float(r[k]) for k in COUNTS] for r in rows}
    finally:
        await conn.close()


def print_run_statements(title: str, arms: list[str], counted: dict[str, dict[tuple[bool, str], list[float]]],
                         leases: dict[str, int], top: int) -> None:
    """Per lease, each arm beside the other: the statements costing most in either."""
    print(f"   {title}: per lease (all runs' leases: " + ", ".join(f"{a} {leases[a]}" for a in arms) + "); "
          "T: sent by a client; us: execution, blk: buffers, dirt: dirtied, wal: bytes, fpi: full pages")
    keys = set().union(*(counted[a].keys() for a in arms))

    def per_lease(arm: str, key: tuple[bool, str], i: int) -> float:
        return counted[arm].get(key, [0.0] * len(COUNTS))[i] / max(leases[arm], 1)

    ranked = sorted(keys, key=lambda k: -max(per_lease(a, k, 1) for a in arms))[:top]
    for key in ranked:
        cells = "  |  ".join(
            f"{per_lease(a, key, 0):5.2f} calls {per_lease(a, key, 1) * 1e3:7.1f} us {per_lease(a, key, 2):6.1f} blk "
            f"{per_lease(a, key, 3):5.2f} dirt {per_lease(a, key, 5):7.0f} wal {per_lease(a, key, 4):5.2f} fpi"
            for a in arms)
        print(f"   {'T' if key[0] else ' '} {cells}  {key[1]}")


# --- the mode ------------------------------------------------------------------------------------------


@dataclass
class TeamsRun(RunResult):
    p_max: int = 1
    calls: float = 0.0         # statements per second
    negotiations: list[float] | None = None


def summary_table(results: list[TeamsRun], maxes: list[int], clients: list[int], arms: list[str]) -> str:
    one, many = arms
    lines = [
        f"| p_max | clients | {one} leases/s (median) | {many} leases/s (median) | "
        f"cost {many} / {one} (= {one} / {many} leases/s) | "
        f"{one} p50 / p99 ms | {many} p50 / p99 ms | {one} runs | {many} runs |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for m in maxes:
        for c in clients:
            row = {}
            for arm in arms:
                rs = [r for r in results if r.p_max == m and r.clients == c and r.arm == arm]
                lat = [x for r in rs for x in r.latencies]
                row[arm] = (statistics.median(r.rate for r in rs), pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3,
                            ", ".join(f"{r.rate:.0f}{'!' if r.drained else ''}" for r in rs))
            a, b = row[one], row[many]
            lines.append(f"| {m} | {c} | {a[0]:.0f} | {b[0]:.0f} | {a[0] / b[0]:.2f} | {a[1]:.2f} / {a[2]:.2f} | "
                         f"{b[1]:.2f} / {b[2]:.2f} | {a[3]} | {b[3]} |")
    return "\n".join(lines)


def run(server: EmbeddedPostgres, args: argparse.Namespace, clients: list[int]) -> list[TeamsRun]:
    maxes = [int(x) for x in args.max.split(",") if x.strip()]
    arms = arm_names(args.teams)
    print(f"# fair share: minion_claim_batch (the API's claim_batch statement), p_max {args.max}; "
          f"{args.subtasks} pending subtasks in {args.teams} tasks, of 1 team ({arms[0]}) or of {args.teams} "
          f"teams ({arms[1]}); shared executors; minion_fair_share_cycle{CYCLE_ARGS} before each run and "
          + (f"every {args.negotiate_every:g} s through it" if args.negotiate_every > 0 else "not during it")
          + f"; {args.runs} runs x {args.seconds:g} s (+{args.warmup:g} s warm-up) "
          "per arm, ABAB, fresh copy per run")
    if args.statements:
        asyncio.run(statements.enable(server))
        print("# pg_stat_statements on (track = all): its counting costs time, so these runs' rates are not "
              "the figures to quote")
    templates = {arm: f"bench_fair_{arm}" for arm in arms}
    executors = {arm: asyncio.run(prepare_template(server, templates[arm], args.subtasks, args.teams,
                                                   1 if arm == arms[0] else args.teams, max(clients)))
                 for arm in arms}

    print("\n## one negotiation (minion_fair_share_cycle) on a fresh copy")
    costs = {}
    for arm in arms:
        cost = asyncio.run(negotiation_cost(server, templates[arm], args.cycle_calls))
        costs[arm] = cost
        print(f"{arm:>9}: {cost['pending']} pending, {cost['turns']} turns written; median {cost['median_ms']:.2f} ms "
              f"(min {cost['min_ms']:.2f}, first on the connection {cost['first_ms']:.2f}) over "
              f"{args.cycle_calls - 1} calls; EXPLAIN ANALYZE execution {cost['explain_ms']:.2f} ms")
        print_statements(f"{arm} negotiation", cost["inside"], 6)
        print(f"   not shown above: a temp table made, truncated and dropped at commit, as the negotiation's "
              f"scratch table is, alone: {cost['scratch_ms']:.2f} ms (median)")
    print(f"ratio {arms[1]} / {arms[0]}: {costs[arms[1]]['median_ms'] / costs[arms[0]]['median_ms']:.2f}")

    results: list[TeamsRun] = []
    for m in maxes:
        for c in clients:
            counted: dict[str, dict[tuple[bool, str], list[float]]] = {arm: {} for arm in arms}
            leased: dict[str, int] = {arm: 0 for arm in arms}
            procs = max(1, -(-c // 4)) if args.procs == "auto" else max(1, min(c, int(args.procs)))
            print(f"\n## p_max {m}, {c} client(s), {procs} client process(es)")
            for n in range(args.runs):
                for arm in arms:
                    db = f"bench_fair_run_{m}_{c}_{n}_{arm}"
                    asyncio.run(admin(server.url, f"DROP DATABASE IF EXISTS {db}",
                                      f"CREATE DATABASE {db} TEMPLATE {templates[arm]}"))
                    url = server.url_for(db)
                    turns, turn_teams = asyncio.run(negotiate(url))
                    wal0, fpi0 = asyncio.run(wal_so_far(url))
                    rs, negotiations = run_clients(url, API.claim_batch, executors[arm][:c], procs, args.warmup,
                                                   args.seconds, batch_args=(None, m, 0.0),
                                                   side=(_negotiator, (args.negotiate_every,))
                                                   if args.negotiate_every > 0 else None)
                    negotiations = negotiations or []
                    if isinstance(negotiations, str):
                        raise RuntimeError(f"the negotiation beside the run failed: {negotiations}")
                    wal1, fpi1 = asyncio.run(wal_so_far(url))
                    leases, pending = asyncio.run(verify(url, arm, rs))
                    teams = asyncio.run(leased_teams(url))
                    if args.statements:
                        leased[arm] += leases
                        for key, values in asyncio.run(run_statements(server, db)).items():
                            acc = counted[arm].setdefault(key, [0.0] * len(COUNTS))
                            counted[arm][key] = [x + y for x, y in zip(acc, values, strict=True)]
                    asyncio.run(admin(server.url, f"DROP DATABASE {db}"))
                    r = TeamsRun(arm, c, sum(x.measured for x in rs) / args.seconds,
                                 [x for w in rs for x in w.latencies], [w.cpu_s / args.seconds for w in rs],
                                 any(w.drained for w in rs), leases, p_max=m,
                                 calls=sum(x.calls for x in rs) / args.seconds, negotiations=negotiations)
                    results.append(r)
                    drained = ""
                    if r.drained:
                        drained = (f" A CLAIM RETURNED NOTHING with {pending} subtasks still pending" if pending
                                   else " QUEUE DRAINED: raise --subtasks")
                    print(f"run {n + 1} {arm:>9}: {r.rate:7.0f} leases/s ({r.calls:5.0f} claims/s)  p50 "
                          f"{pct(r.latencies, .5) * 1e3:6.2f} ms  p99 {pct(r.latencies, .99) * 1e3:6.2f} ms  "
                          f"{turns} turns for {turn_teams} teams before; leases went to {teams} team(s); "
                          f"negotiations beside: {len(negotiations)}, median "
                          f"{statistics.median(negotiations or [math.nan]) * 1e3:.1f} ms; client CPU "
                          f"{'/'.join(f'{x * 100:.0f}%' for x in r.cpu)}; verified: {leases} leases, each "
                          f"subtask once; WAL (the cluster's, the run's): {(wal1 - wal0) / max(leases, 1):.0f} B and "
                          f"{(fpi1 - fpi0) / max(leases, 1):.2f} full pages a lease{drained}", flush=True)
            if args.statements:
                print_run_statements(f"p_max {m}, {c} client(s)", arms, counted, leased, 30)

    if args.explain:
        print("\n## inside one claim (after 50 on the same connection, on a fresh negotiated copy)")
        for m in maxes:
            for arm in arms:
                inside = asyncio.run(claim_statements(server, templates[arm], executors[arm][0], m, 50))
                print_statements(f"p_max {m} {arm} claim", inside, 8)

    print(f"\n{summary_table(results, maxes, clients, arms)}")
    if any(r.drained for r in results):
        print("\n(!) a claim found nothing during that run (see its line): its rate is a lower bound")
    return results
