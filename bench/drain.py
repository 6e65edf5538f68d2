"""Draining a queue of one-record sleep subtasks, every arm in one run on one embedded PostgreSQL
alternating arm by arm, medians of the runs:

    python bench/drain.py [--subtasks 20000] [--clients 16] [--runs 3] [--arms ...]

Arms (each run on a fresh database cloned from a migrated template, so every arm starts alike):
  sql-baseline  direct SQL, `--clients` connections looping minion_claim + minion_complete, with the
                task-progress functions as shipped at b1943b0 (bench/baseline_b1943b0.sql, applied
                over the schema in the scratch database): every complete updates the task's row.
  sql-new       the same loop with the functions of this tree (sql/schema/04_tasks.sql).
  sql-batch10   the batched steps the API runs: minion_claim_batch of 10, then minion_complete_batch
                of the leases won, in (task, subtask) order (sql/schema/06_leases.sql).
  pgq-batch10   PgQueuer 1.6 (`pip install -e .[bench]`): `--clients` QueueManagers, one
                connection each, drain no-op jobs with batch_size=10.
  pgq-batch1    the same, batch_size=1 (unbatched).
  latency       submit -> first lease, direct SQL: minion_submit_task of a one-record task split
                in its transaction, an idle executor woken by the 'subtasks' NOTIFY claims it;
                and through the API (the real services): POST /api/v1/tasks of a one-record inline
                task until an executor waiting in its long-poll claim holds the lease (its record
                kept in the database, sql/schema/08_inputs.sql; and, `submit-http-object`, written as an input
                object); beside PgQueuer's enqueue -> entrypoint start (`--latency`
                samples each). Every arm leaves the system idle IDLE_BEFORE_S before each sample
                (the HTTP arm's executor must be waiting in its long poll): an idle machine is slower
                to answer, so back-to-back samples in one arm only would not compare. `--queued N`:
                each latency arm measures with N one-record tasks (PgQueuer: N jobs) already waiting
                that its executor (entrypoint) does not serve.
  http-unbatched  the real services (API, splitter, watchdog as processes, minions/testing/processes.py)
                on the run's database with a local-folder store, and `--clients` simulated executors
                in this process (the agent's ExecutorClient, aiohttp, one session each; outputs by
                the agent's SleepRunner and encode_outputs), each one subtask at a time: claim
                (no `max`) -> GET the input range from its URL -> PUT the output to its URL ->
                complete. The API runs with MINIONS_INLINE_INPUT_BYTES=0 and
                MINIONS_INPUT_IN_DATABASE_BYTES=0, so the claim carries no inline input and the
                four requests are really four. (The other HTTP arms' task, its records at most 64
                KiB up to ~3,000 subtasks, has its input kept in the database, sql/schema/08_inputs.sql: the claims
                read it in their own statement.)
  http-inline1  the same services, inline inputs on (the default 64 KiB): one subtask per request, as
                unbatched, but its input rides in the claim's answer and its output in the complete:
                claim (no `max`) -> complete with `output`, two requests a subtask.
  http-batch10  the same services (inline inputs on, the default 64 KiB): each executor claims with
                `max=10`, reads the inputs inline from the claim's answer and completes all its
                leases in one `POST /api/v1/leases/complete` carrying the outputs inline: two
                requests per ten subtasks. Results of at most MINIONS_RESULT_IN_DATABASE_BYTES (4 KiB)
                are committed in their subtask's row (sql/schema/07_results.sql), as every result here is.
  http-batch10-objects  the same with MINIONS_RESULT_IN_DATABASE_BYTES=0: each verified result copied
                to its own object (a file, an fsync, a rename), as a result too big for its row is.
The HTTP arms submit the task through the API (one record a subtask, split at submit), register
their executors, then time the drain; claims use `wait=0`, so an executor stops at its first 204
(the queue is empty), as the direct-SQL clients stop at their first empty claim. `--api-workers`
sets `minions api --workers` (default: the cores, as `minions up` does).

The figure is subtasks (jobs) per second from the first claim to the last complete. The direct SQL
and HTTP arms then check the end state: every subtask done once, and the task completed exactly
once (direct SQL: running the splitter's settle sweep, as the splitter would on the tail's NOTIFY;
HTTP: the splitter process does it), and the HTTP arms read the results back through the API: one
line per record, the ids in input order.

Makespan (`--makespan 2000`, 0 to skip; `--makespan-ms 5`): ONE real agent process (`python -m
minions.agents.macos`, as tests/e2e start it: pipelined, batched claims) against the same real
services drains a task of that many one-record `sleep` subtasks of `--makespan-ms` each. Makespan is
the task's created_at -> finished_at (submit to completed, the database's clock), over the pure
compute (subtasks x ms); also shown: first lease -> last complete. Runs `--runs` times, after the
drain arms, each on a fresh database; the table gives the median.

This process (the direct-SQL clients, PgQueuer's workers, the simulated executors, the SDK client of
the latency arms) runs on uvloop where installed, as the services and the agent do (minions/runtime.py):
every arm in it on the same loop.

The HTTP arms and the makespan also print the CPU time per subtask each process spent over the
measurement (the API with its workers, PostgreSQL with its backends, splitter and watchdog, this
process, the agent; from /proc): on a small machine the protocol's CPU, not waiting, sets the pace.

`--statements N`: after each drain arm's run, its N costliest statements per subtask, those run
inside functions included, with their planning and buffers (pg_stat_statements, bench/statements.py).
It slows every arm down: a run with it shows where the time goes, not the table's figures, and it
skips the makespan and the latency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import platform
import shutil
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench import limits, machine, statements  # noqa: E402
from bench.scratch import admin, scratch_postgres  # noqa: E402
from minions import jsoncodec, protocol, runtime  # noqa: E402
from minions.agents.macos.client import ExecutorClient  # noqa: E402
from minions.agents.macos.jsonl import encode_outputs, parse_records  # noqa: E402
from minions.agents.macos.runners.sleep import SleepRunner  # noqa: E402
from minions.config import Settings  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402
from minions.sdk import MinionsClient  # noqa: E402
from minions.testing.agents import AgentFleet  # noqa: E402
from minions.testing.cluster import log_events  # noqa: E402
from minions.testing.factories import make_executor, make_task, make_token, make_tokens  # noqa: E402
from minions.testing.processes import Services  # noqa: E402

BASELINE_SQL = Path(__file__).resolve().parent / "baseline_b1943b0.sql"
TEMPLATE = "bench_drain_template"
# Latency arms: the idle time before each sample, the same in every arm. On this VM a statement after
# 20 ms of idleness took 1.3 ms longer than one back to back (an ad hoc probe, docs/benchmarks/drain.md
# "Submit -> first lease"); the HTTP arm needs the gap (its executor must be waiting in its long poll).
IDLE_BEFORE_S = 0.02
ALL_ARMS = ("sql-baseline", "sql-new", "sql-batch10", "pgq-batch10", "pgq-batch1", "http-unbatched",
            "http-inline1", "http-batch10", "http-batch10-objects")


async def prepare_template(server: EmbeddedPostgres) -> None:
    await admin(server.url, f"DROP DATABASE IF EXISTS {TEMPLATE}", f"CREATE DATABASE {TEMPLATE}")
    await migrate(server.url_for(TEMPLATE))
    await admin(server.url, f"ALTER DATABASE {TEMPLATE} WITH ALLOW_CONNECTIONS false")


async def scratch(server: EmbeddedPostgres) -> tuple[str, str]:
    name = f"drain_{uuid.uuid4().hex[:8]}"
    await admin(server.url, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    return name, server.url_for(name)


# --- direct SQL ---------------------------------------------------------------------------------


async def sql_drain(c: asyncpg.Connection, executor: uuid.UUID, token_id: int, batch: int) -> int:
    """One direct-SQL client until the queue is empty; subtasks completed. batch 1: minion_claim +
    minion_complete (the first protocol's steps); N: minion_claim_batch of N + minion_complete_batch
    of the leases won, in (task, subtask) order, as the API runs them."""
    done = 0
    while batch == 1:
        lease = await c.fetchrow("SELECT lease_token, records FROM minion_claim($1, 60)", executor)
        if lease is None:
            return done
        verdict = await c.fetchval("SELECT minion_complete($1, $2, 0.0)", lease["lease_token"], lease["records"])
        assert verdict == "ok", verdict
        done += 1
    while True:
        won = [r for r in await c.fetch("SELECT * FROM minion_claim_batch($1, $2, $3)", executor, token_id, batch)
               if r["verdict"] == "leased"]
        if not won:
            return done
        won.sort(key=lambda r: (r["task_id"], r["subtask_id"]))
        n = len(won)
        answers = await c.fetch("SELECT * FROM minion_complete_batch($1, $2, $3, $4, $5, $6)",
                                [r["lease_token"] for r in won], [r["records"] for r in won], [0.0] * n,
                                [f"results/{uuid.uuid4()}" for _ in won], [bytes(32)] * n, [10] * n)
        assert {a["verdict"] for a in answers} == {"ok"}, answers
        done += n


async def sql_arm(url: str, subtasks: int, clients: int, baseline: bool, batch: int = 1,
                  prepare: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
                  check_end: bool = True) -> float:
    """`prepare`: run on the scratch database before the task is made (bench/drain_ceiling.py's
    variants); `check_end`: False for a variant that no longer keeps what the end check reads."""
    conn = await connect(url)
    if baseline:
        await conn.execute(BASELINE_SQL.read_text())
    if prepare is not None:
        await prepare(conn)
    _, token_id = await make_token(conn, "executor")
    executors = [await make_executor(conn, token_id, name=f"drain-{i}") for i in range(clients)]
    task_id = await make_task(conn, subtasks=subtasks)
    await conn.execute("VACUUM ANALYZE")
    conns = [await connect(url) for _ in range(clients)]

    start = time.perf_counter()
    done = await asyncio.gather(*(sql_drain(c, e, token_id, batch) for c, e in zip(conns, executors, strict=True)))
    elapsed = time.perf_counter() - start
    for c in conns:
        await c.close()
    if not check_end:  # at least: every subtask was completed once
        assert sum(done) == subtasks, (sum(done), subtasks)
        await conn.close()
        return subtasks / elapsed
    # The end state: every subtask done once, the task completed once.
    for row in await conn.fetch("SELECT minion_settle_candidates(100) AS id"):
        await conn.fetchval("SELECT minion_settle_waiting($1)", row["id"])
    await check_end_state(conn, task_id, subtasks)
    await conn.close()
    return subtasks / elapsed


async def check_end_state(conn: asyncpg.Connection, task_id: int, subtasks: int, wait_s: float = 0.0) -> None:
    """Every subtask done once (one attempt each), the task completed; waits up to `wait_s` for the
    task to complete (the splitter settles it, when services run)."""
    deadline = time.monotonic() + wait_s
    while True:
        state = await conn.fetchrow(
            """SELECT t.status, (SELECT count(*) FROM subtasks WHERE task_id = t.id AND state = 'done') AS done,
                      (SELECT count(*) FROM subtask_attempts WHERE task_id = t.id) AS attempts
                 FROM tasks t WHERE t.id = $1""", task_id)
        if state["status"] == "completed" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert (state["status"], state["done"], state["attempts"]) == ("completed", subtasks, subtasks), dict(state)


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


async def queue_unserved_tasks(url: str, n: int) -> None:
    """`--queued`: `n` one-record tasks split and waiting, of a kind no measuring executor serves
    (embedding), as a busy cluster's queue holds other teams' work."""
    if n:
        conn = await connect(url)
        await conn.fetchval("""SELECT count(t.id) FROM generate_series(1, $1) AS i, LATERAL minion_submit_task(
                                   'queued', 'p', 'q-' || i, 'embedding', 'm', '{}', 0, 1, NULL, 'file:///x.jsonl',
                                   'h', NULL, '{0}', '{10}', '{0}', '{1}') AS t""", n)
        await conn.close()


async def sql_submit_latency(url: str, n: int, queued: int = 0) -> list[float]:
    """Direct SQL: minion_submit_task of a one-record task split in its own transaction, until an
    idle executor (woken by the 'subtasks' NOTIFY, as the API's claim waiters are) holds its lease."""
    await queue_unserved_tasks(url, queued)
    conn = await connect(url)
    _, token_id = await make_token(conn, "executor")
    executor = await make_executor(conn, token_id, name="latency")
    claimer = await connect(url)
    woken: asyncio.Queue[float] = asyncio.Queue()
    await claimer.add_listener("subtasks", lambda *_: woken.put_nowait(time.perf_counter()))
    samples = []
    for i in range(n):
        await asyncio.sleep(IDLE_BEFORE_S)
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


async def pgq_start_latency(url: str, n: int, queued: int = 0) -> list[float]:
    """PgQueuer: enqueue one job until its entrypoint starts, a QueueManager idle on LISTEN; with
    `queued` jobs of an entrypoint it does not serve waiting."""
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    setup = await asyncpg.connect(url)
    queries = Queries(AsyncpgDriver(setup))
    await queries.install()
    if queued:
        await queries.enqueue(["unserved"] * queued, [None] * queued, [0] * queued)
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
        await asyncio.sleep(IDLE_BEFORE_S)
        start = time.perf_counter()
        await queries.enqueue("noop", None)
        samples.append(await started.get() - start)
    qm.shutdown.set()
    await runner
    await worker_conn.close()
    await setup.close()
    return samples


async def http_submit_latency(url: str, n: int, args: argparse.Namespace, arm: str = "submit-http",
                              **env: str) -> list[float]:
    """Through the API: `POST /api/v1/tasks` of a one-record inline task (split in its transaction, its
    record kept in the database unless `env` says otherwise), until an executor long-polling
    `claim?max=10` (waiting before the submit, woken by the NOTIFY as every waiting claim is) has its
    lease in hand, inline input included."""
    samples, answered, leased = [], [], []
    await queue_unserved_tasks(url, args.queued)
    async with running_services(url, args, **env) as (services, admin_token, executor_token), \
            MinionsClient(services.api_url, admin_token) as submitter, \
            ExecutorClient(services.api_url, executor_token) as executor:
        executor_id = (await executor.register({"name": "latency", "hardware": {"os": "bench", "device": "cpu"},
                                                 "kinds": ["sleep"]})).executor_id

        async def claim() -> tuple[list[protocol.Lease], float]:
            claims = await executor.claim_batch(executor_id, 5, 10)
            return claims, time.perf_counter()

        for i in range(n):
            claiming = asyncio.create_task(claim())
            await asyncio.sleep(IDLE_BEFORE_S)  # waiting in its long poll
            start = time.perf_counter()
            await submitter.submit({"team": TEAM, "project": PROJECT, "name": f"lat-{i}", "kind": "sleep",
                                    "input": {"records": [{"id": "r0", "ms": 0}]}, "subtask_size": 1})
            answered.append(time.perf_counter() - start)
            claims, in_hand = await claiming
            samples.append(time.perf_counter() - start)
            leased.append(in_hand - start)
            assert len(claims) == 1 and claims[0].subtask.input.data is not None, claims
            await executor.complete(claims[0].token, 1, 0.0, output=b'{"id": "r0", "slept_ms": 0}\n')
    # Where the time goes: the submit's own answer, and the lease (which comes after it nearly always).
    first = sum(1 for a, b in zip(leased, answered, strict=True) if a < b)
    print(f"  {arm}: POST answered p50 {_p50_p99(answered)[0]:.2f} ms, lease in "
          f"hand p50 {_p50_p99(leased)[0]:.2f} ms; the lease before the POST's answer in {first} of {n}", flush=True)
    return samples


async def latency_all(server: EmbeddedPostgres, n: int, args: argparse.Namespace) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    arms: tuple[tuple[str, Callable[[str, int], Awaitable[list[float]]]], ...] = (
        ("submit-sql", lambda url, n: sql_submit_latency(url, n, args.queued)),
        ("submit-http", lambda url, n: http_submit_latency(url, n, args)),
        # The input as an object (sql/schema/08_inputs.sql's setting at 0): the path before small inputs were kept.
        ("submit-http-object", lambda url, n: http_submit_latency(url, n, args, "submit-http-object",
                                                                           MINIONS_INPUT_IN_DATABASE_BYTES="0")),
        ("pgq-enqueue", lambda url, n: pgq_start_latency(url, n, args.queued)))
    for arm, measure in arms:
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


# --- HTTP: the real services, simulated executors ------------------------------------------------

TEAM, PROJECT = "bench", "drain"
# One agent's makespan over the pure compute of its sleep subtasks (2,000 x 5 ms).
MAKESPAN_TARGET = 1.10


def sleep_records(n: int, ms: int) -> list[dict[str, Any]]:
    return [{"id": f"r{i:06d}", "ms": ms} for i in range(n)]


@contextlib.asynccontextmanager
async def running_services(url: str, args: argparse.Namespace, **env: str) -> AsyncIterator[tuple[Services, str, str]]:
    """API, splitter and watchdog as processes on the database `url` with a local-folder store; an
    admin and an executor token."""
    admin_token, executor_token = await make_tokens(url)
    workdir = Path(args.workdir) / f"services-{uuid.uuid4().hex[:8]}"
    # The safety-net sweeps at production's period, not the test harness's 1 s: with tasks queued, a
    # splitter sweep reads every open one (`--queued`).
    sweep_s = {f.name: f.default for f in dataclasses.fields(Settings)}["sweep_interval_s"]
    services = Services(url, workdir, heartbeat_interval_s=5.0, lease_timeout_s=60.0, long_poll_s=5.0,
                        extra_env={"MINIONS_LOG_LEVEL": "warning", "MINIONS_API_WORKERS": str(args.api_workers),
                                   "MINIONS_SWEEP_INTERVAL_S": str(sweep_s), **env})
    try:
        await services.start_all()
        yield services, admin_token, executor_token
    except BaseException:
        print(services.logs()[-4000:], file=sys.stderr)
        raise
    finally:
        services.stop_all()
        # The services' warnings (a 503 retry answered, say), counted by event, the first of each shown.
        seen: dict[str, list[str]] = {}
        for line in "".join(service.log() for service in services.running.values()).splitlines():
            try:
                entry = jsoncodec.loads(line)
            except ValueError:
                entry = {"event": "(not JSON)", "level": "error"}
            if isinstance(entry, dict) and entry.get("level") in ("warning", "error", "critical"):
                seen.setdefault(str(entry.get("event")), []).append(line)
        for event, lines in seen.items():
            print(f"#   services logged {len(lines)} x {event}: {lines[0][:300]}", flush=True)
        shutil.rmtree(workdir, ignore_errors=True)


async def submit_sleep_task(services: Services, admin_token: str, conn: asyncpg.Connection, name: str,
                            records: list[dict[str, Any]]) -> int:
    """The task, one record a subtask, submitted through the API; its id once every subtask exists."""
    async with MinionsClient(services.api_url, admin_token) as client:
        await client.submit({"team": TEAM, "project": PROJECT, "name": name, "kind": "sleep",
                             "input": {"records": records}, "subtask_size": 1})
    deadline = time.monotonic() + 60
    while True:
        row = await conn.fetchrow("SELECT id, split_done FROM tasks WHERE team = $1 AND project = $2 AND name = $3",
                                  TEAM, PROJECT, name)
        if row is not None and row["split_done"]:
            return int(row["id"])
        assert time.monotonic() < deadline, f"task {name} was never split"
        await asyncio.sleep(0.05)


async def check_results(services: Services, admin_token: str, name: str, records: list[dict[str, Any]]) -> None:
    """The task's results through the API: one line per input record, its id, in input order."""
    async with MinionsClient(services.api_url, admin_token) as client:
        body = b"".join([chunk async for chunk in client.results(TEAM, PROJECT, name)])
    got = [jsoncodec.loads(line) for line in body.splitlines() if line.strip()]
    want = [{"id": r["id"], "slept_ms": r["ms"]} for r in records]
    assert got == want, f"results differ: {len(got)} lines, first differing at " \
        f"{next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))}"


async def sim_executor(client: ExecutorClient, executor_id: str, batch: int) -> int:
    """Drains until a claim (`wait=0`) answers 204; subtasks completed. batch 1: claim without
    `max`, GET, PUT, complete; batch 0: claim without `max`, inline input, complete with the output
    inline; else claim `max=batch`, inline inputs, one batched complete."""
    runner = SleepRunner()
    done = 0
    while True:
        if batch == 0:
            claim = await client.claim(executor_id, 0)
            if claim is None:
                return done
            sub = claim.subtask
            assert sub.input.data is not None, "no inline input in the inline arm"
            records = parse_records(await client.download(sub.input), sub.input.records)  # inline: no request
            output = encode_outputs(records, await runner.run(sub, records))
            await client.complete(claim.token, len(records), 0.0, output=output)
            done += 1
            continue
        if batch == 1:
            claim = await client.claim(executor_id, 0)
            if claim is None:
                return done
            sub = claim.subtask
            assert sub.input.data is None, "inline input in the unbatched arm"
            records = parse_records(await client.download(sub.input), sub.input.records)  # a GET
            await client.upload(sub.output_url, encode_outputs(records, await runner.run(sub, records)))
            await client.complete(claim.token, len(records), 0.0)
            done += 1
            continue
        claims = await client.claim_batch(executor_id, 0, batch)
        if not claims:
            return done
        completions = []
        for claim in claims:
            sub = claim.subtask
            assert sub.input.data is not None, "no inline input in the batched arm"
            records = parse_records(await client.download(sub.input), sub.input.records)  # inline: no request
            output = encode_outputs(records, await runner.run(sub, records))
            completions.append(protocol.LeaseCompletion(token=claim.token, records=len(records), seconds=0.0,
                                                        output=output.decode()))
        refused = {token: str(err) for token, err in (await client.complete_batch(completions)).items() if err}
        assert not refused, refused
        done += len(completions)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its descendants, reaped children included (Linux /proc)."""
    ticks, stack = 0, [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
            for thread in Path(f"/proc/{current}/task").iterdir():
                stack += [int(child) for child in (thread / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds the services, PostgreSQL, this process and `others` spend between start() and
    report(): where the time of a measurement goes."""

    def __init__(self, server: EmbeddedPostgres, services: Services, **others: int) -> None:
        self.pids = {"api": [p.pid for n, s in services.running.items() if n == "api" and (p := s.process)],
                     "splitter+watchdog": [p.pid for n, s in services.running.items()
                                           if n != "api" and (p := s.process)],
                     "postgres": [int((server.pgdata / "postmaster.pid").read_text().split()[0])],
                     **{name: [pid] for name, pid in others.items()}}
        self.start()

    def _now(self) -> dict[str, float]:
        return {"bench": time.process_time(),
                **{name: sum(tree_cpu_s(pid) for pid in pids) for name, pids in self.pids.items()}}

    def start(self) -> None:
        self.started = self._now()

    def spent(self) -> dict[str, float]:
        """CPU seconds by process (group) since start()."""
        return {name: value - self.started[name] for name, value in self._now().items()}

    def report(self, what: str, per: int) -> str:
        spent = self.spent()
        shares = ", ".join(f"{name} {s / per * 1000:.2f}" for name, s in spent.items())
        return f"#   CPU ms per subtask over {what}: {shares} (bench: this process; the executors, in the HTTP arms)"


async def sim_executors(stack: contextlib.AsyncExitStack, services: Services, token: str, n: int,
                        prefix: str) -> tuple[list[ExecutorClient], list[str]]:
    """`n` simulated sleep executors registered as `prefix`-0.. (clients closed with `stack`), and their ids."""
    clients = [await stack.enter_async_context(ExecutorClient(services.api_url, token)) for _ in range(n)]
    ids = [(await c.register({"name": f"{prefix}-{i}", "hardware": {"os": "bench", "device": "cpu"},
                              "kinds": ["sleep"]})).executor_id for i, c in enumerate(clients)]
    return clients, ids


async def http_arm(server: EmbeddedPostgres, url: str, args: argparse.Namespace, batch: int, **env: str) -> float:
    if batch == 1:  # four requests: the input read from its object, not inline (nor kept in the database)
        env["MINIONS_INLINE_INPUT_BYTES"] = env["MINIONS_INPUT_IN_DATABASE_BYTES"] = "0"
    conn = await connect(url)
    async with running_services(url, args, **env) as (services, admin_token, executor_token), \
            contextlib.AsyncExitStack() as stack:
        records = sleep_records(args.subtasks, 0)
        task_id = await submit_sleep_task(services, admin_token, conn, "drain", records)
        clients, ids = await sim_executors(stack, services, executor_token, args.clients, "drain")
        await conn.execute("VACUUM ANALYZE")
        meter = CpuMeter(server, services)
        start = time.perf_counter()
        done = await asyncio.gather(*(sim_executor(c, e, batch) for c, e in zip(clients, ids, strict=True)))
        elapsed = time.perf_counter() - start
        print(meter.report("the drain", args.subtasks), flush=True)
        assert sum(done) == args.subtasks, (sum(done), args.subtasks)
        await check_end_state(conn, task_id, args.subtasks, wait_s=60)
        await check_results(services, admin_token, "drain", records)
    await conn.close()
    return float(args.subtasks / elapsed)


# --- one real agent: makespan --------------------------------------------------------------------


async def makespan_run(server: EmbeddedPostgres, url: str, args: argparse.Namespace) -> tuple[float, float]:
    """(submit -> completed, first lease -> last complete), seconds, of one agent process draining
    `--makespan` one-record sleep subtasks of `--makespan-ms` each. Prints the CPU time each process
    spent meanwhile."""
    conn = await connect(url)
    async with running_services(url, args) as (services, admin_token, executor_token):
        fleet = AgentFleet(services, executor_token)
        agent = fleet.start("makespan", *args.makespan_agent_arg)
        try:
            deadline = time.monotonic() + 60
            while not await conn.fetchval("SELECT count(*) FROM executors WHERE name = 'makespan'"):
                assert agent.process.poll() is None and time.monotonic() < deadline, agent.log()[-3000:]
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # idle in its long poll
            meter = CpuMeter(server, services, agent=agent.process.pid)
            records = sleep_records(args.makespan, args.makespan_ms)
            task_id = await submit_sleep_task(services, admin_token, conn, "makespan", records)
            await check_end_state(conn, task_id, args.makespan, wait_s=600)
            print(meter.report("the makespan", args.makespan), flush=True)
            print(depth_report(agent.log()), flush=True)
            await check_results(services, admin_token, "makespan", records)
            row = await conn.fetchrow(
                """SELECT extract(epoch FROM t.finished_at - t.created_at) AS makespan,
                          (SELECT extract(epoch FROM max(a.ended_at) - min(a.started_at))
                             FROM subtask_attempts a WHERE a.task_id = t.id) AS drain
                     FROM tasks t WHERE t.id = $1""", task_id)
        except BaseException:
            print(fleet.logs(), file=sys.stderr)
            raise
        finally:
            fleet.stop_all()
    await conn.close()
    return float(row["makespan"]), float(row["drain"])


def depth_report(log: str) -> str:
    """The claim-ahead depths the agent chose (its `claim_depth` log lines) and the figures the last
    one came from: what the pipeline was allowed to hold while the device ran."""
    chosen = log_events(log, "claim_depth")
    if not chosen:
        return "#   claim depth: never logged"
    last = chosen[-1]
    return (f"#   claim depth: {' -> '.join(str(e['leases']) for e in chosen[-8:])} "
            f"(last: low water {last.get('low_water')}, run {last['run_s']} s, round trip {last['round_trip_s']} s "
            f"of which claim {last.get('claim_s')} s and fetch {last.get('fetch_s')} s, cap {last['cap']})")


async def makespan_all(server: EmbeddedPostgres, args: argparse.Namespace) -> list[tuple[float, float]]:
    out = []
    for run in range(args.runs):
        name, url = await scratch(server)
        try:
            out.append(await makespan_run(server, url, args))
        finally:
            await admin(server.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        compute = args.makespan * args.makespan_ms / 1000
        print(f"run {run + 1} makespan      {out[-1][0]:9.2f} s = {out[-1][0] / compute:.2f}x compute "
              f"(first lease -> last complete {out[-1][1]:.2f} s)", flush=True)
    return out


# --- the run ------------------------------------------------------------------------------------


def arm_runner(server: EmbeddedPostgres, arm: str, args: argparse.Namespace,
               ) -> Callable[[str], Awaitable[float]] | str:
    """The arm's measurement, or why it is skipped."""
    if arm == "sql-baseline":
        return lambda url: sql_arm(url, args.subtasks, args.clients, baseline=True)
    if arm == "sql-new":
        return lambda url: sql_arm(url, args.subtasks, args.clients, baseline=False)
    if arm == "sql-batch10":
        return lambda url: sql_arm(url, args.subtasks, args.clients, baseline=False, batch=10)
    if arm.startswith("pgq-"):
        try:
            import pgqueuer  # noqa: F401
        except ImportError:
            return "PgQueuer is not installed (pip install -e '.[bench]')"
        batch = int(arm.removeprefix("pgq-batch"))
        return lambda url: pgq_arm(url, args.subtasks, args.clients, batch)
    if arm.startswith("http-"):
        batches = {"http-unbatched": 1, "http-inline1": 0, "http-batch10-objects": 10}
        batch = batches[arm] if arm in batches else int(arm.removeprefix("http-batch"))
        env = {"MINIONS_RESULT_IN_DATABASE_BYTES": "0"} if arm.endswith("-objects") else {}
        return lambda url: http_arm(server, url, args, batch, **env)
    raise AssertionError(arm)


async def run_all(server: EmbeddedPostgres, args: argparse.Namespace) -> dict[str, list[float]]:
    await prepare_template(server)
    runners = {arm: arm_runner(server, arm, args) for arm in args.arms}
    for arm, r in runners.items():
        if isinstance(r, str):
            print(f"# {arm}: skipped: {r}")
    rates: dict[str, list[float]] = {arm: [] for arm, r in runners.items() if not isinstance(r, str)}
    for run in range(args.runs):
        for arm in rates:
            runner = runners[arm]
            assert not isinstance(runner, str)
            name, url = await scratch(server)
            if args.statements:
                await statements.reset(server)
            try:
                rate = await runner(url)
            finally:
                await admin(server.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            rates[arm].append(rate)
            print(f"run {run + 1} {arm:20s} {rate:9.0f} /s", flush=True)
            if args.statements:
                print(await statements.report(server, f"run {run + 1} {arm}", args.subtasks, args.statements),
                      flush=True)
    return rates


def table(rates: dict[str, list[float]]) -> str:
    medians = {arm: statistics.median(v) for arm, v in rates.items()}
    refs = {"sql-new": "sql-baseline", "pgq-batch1": "pgq-batch10", "sql-baseline": "pgq-batch10",
            "http-unbatched": "sql-new", "http-inline1": "sql-new", "http-batch10": "pgq-batch10",
            "http-batch10-objects": "pgq-batch10",
            "sql-batch10": "pgq-batch10"}
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
    p.add_argument("--queued", type=int, default=0, metavar="N",
                   help="latency arms: N tasks (PgQueuer: jobs) already waiting that the measuring executor "
                        "does not serve")
    p.add_argument("--fsync-off", action="store_true", help="fsync=off for every arm (default: on)")
    p.add_argument("--api-workers", type=int, default=os.cpu_count() or 1,
                   help="HTTP arms: `minions api --workers` (default: the cores, as `minions up`)")
    p.add_argument("--makespan", type=int, default=2000,
                   help="one agent process drains this many one-record sleep subtasks (0: skip)")
    p.add_argument("--makespan-ms", type=int, default=5, help="each makespan subtask sleeps this long")
    p.add_argument("--makespan-agent-arg", action="append", default=[], metavar="ARG",
                   help="an argument for the makespan's agent, e.g. --makespan-agent-arg=--max-leases=16 "
                        "(repeatable)")
    p.add_argument("--statements", type=int, default=0, metavar="N",
                   help="after each drain arm's run, its N costliest statements per subtask, from "
                        "pg_stat_statements (bench/statements.py; slows every arm down: not for the table; "
                        "skips the makespan and the latency)")
    args = p.parse_args(argv)
    unknown = set(args.arms) - set(ALL_ARMS)
    if unknown:
        p.error(f"unknown arms: {sorted(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with scratch_postgres("minions-bench-drain-", fast=args.fsync_off) as (server, root):
        print(f"# drain: {platform.node()}, nproc={os.cpu_count()}; {args.subtasks} one-record subtasks, "
              f"{args.clients} clients, {args.runs} runs per arm alternating, "
              f"{'fsync=off' if args.fsync_off else 'fsync on'}")
        args.workdir = str(root)
        if args.statements:
            runtime.run(statements.enable(server))
            if args.makespan or args.latency:
                print("# --statements: makespan and latency skipped (the counting would slow them too)")
                args.makespan = args.latency = 0
        rates = runtime.run(run_all(server, args))
        print()
        print(table(rates))
        if args.makespan:
            spans = runtime.run(makespan_all(server, args))
            compute = args.makespan * args.makespan_ms / 1000
            median = statistics.median(s for s, _ in spans)
            print()
            print(f"makespan, one agent, {args.makespan} x {args.makespan_ms} ms sleep subtasks "
                  f"(compute {compute:.1f} s): median {median:.2f} s = {median / compute:.2f}x compute "
                  f"(runs: {', '.join(f'{s:.2f}' for s, _ in spans)}; first lease -> last complete: "
                  f"{', '.join(f'{d:.2f}' for _, d in spans)})")
            limits.report(limits.Ratio("bench/drain.py --makespan", f"{args.makespan} x {args.makespan_ms} ms sleep "
                                       "subtasks, one agent: makespan", "pure compute", median / compute,
                                       MAKESPAN_TARGET, at_least=False, machine=machine.describe()))
        if args.latency:
            lat = runtime.run(latency_all(server, args.latency, args))
            print()
            if args.queued:
                print(f"# latency with {args.queued} tasks (PgQueuer: jobs) waiting that no measuring executor serves")
            print("| latency | p50 ms | p99 ms | p50 ratio |\n|---|---:|---:|---|")
            ref = _p50_p99(lat["pgq-enqueue"])[0] if "pgq-enqueue" in lat else None
            for arm, samples in lat.items():
                p50, p99 = _p50_p99(samples)
                ratio = f"{p50 / ref:.2f}x pgq-enqueue" if ref and arm != "pgq-enqueue" else ""
                print(f"| {arm} | {p50:.2f} | {p99:.2f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
