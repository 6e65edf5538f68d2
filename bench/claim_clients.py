"""The clients of the claim benchmarks (bench/claim.py, and bench/claim_teams.py for its
`--fair-share`): worker processes forked for each run, each driving asyncpg connections that claim
in a loop and time each claim inside the window; the check after each run that no subtask was
leased twice; and a run's figures.

Apart from bench/claim.py so that bench/claim_teams.py, which bench/claim.py runs, shares them
without importing bench/claim.py back."""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import asyncpg

# --- one run's clients (in forked worker processes) -------------------------------------------------


@dataclass
class WorkerResult:
    measured: int = 0                      # claims that started and ended inside the window
    calls: int = 0                         # of those, the statements (a batched claim returns several)
    latencies: list[float] = field(default_factory=list)
    claims: list[tuple[int, int, str]] = field(default_factory=list)  # every claim: task, subtask, token
    drained: bool = False                  # some client found the queue empty before the window ended
    cpu_s: float = 0.0                     # this process's CPU time inside the window
    late: bool = False                     # connections were not ready when the warm-up began
    error: str | None = None


async def _client(conn: asyncpg.Connection, sql: str, executor: uuid.UUID, start: float, end: float,
                  out: WorkerResult) -> None:
    fetchrow = conn.fetchrow
    clock = time.monotonic
    while True:
        t0 = clock()
        if t0 >= end:
            return
        row = await fetchrow(sql, executor)
        t1 = clock()
        if row is None:
            out.drained = out.drained or t1 < end
            return
        out.claims.append((row["task_id"], row["subtask_id"], row["lease_token"]))
        if t0 >= start and t1 <= end:
            out.measured += 1
            out.calls += 1
            out.latencies.append(t1 - t0)


async def _batch_client(conn: asyncpg.Connection, sql: str, args: tuple[Any, ...], executor: uuid.UUID,
                        start: float, end: float, out: WorkerResult) -> None:
    """A claim of several leases a statement (minion_claim_batch's rows: a lease each, or one row whose
    verdict says why none); a latency is one statement's."""
    fetch = conn.fetch
    clock = time.monotonic
    while True:
        t0 = clock()
        if t0 >= end:
            return
        rows = await fetch(sql, executor, *args)
        t1 = clock()
        leases = [(r["task_id"], r["subtask_id"], r["lease_token"]) for r in rows if r["verdict"] == "leased"]
        if not leases:
            out.drained = out.drained or t1 < end
            return
        out.claims.extend(leases)
        if t0 >= start and t1 <= end:
            out.measured += len(leases)
            out.calls += 1
            out.latencies.append(t1 - t0)


async def _cpu_window(start: float, end: float, out: WorkerResult) -> None:
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    c0 = time.process_time()
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    out.cpu_s = time.process_time() - c0


async def _worker_main(url: str, sql: str, executors: list[uuid.UUID], go: float, start: float,
                       end: float, batch_args: tuple[Any, ...] | None) -> WorkerResult:
    out = WorkerResult()
    conns = [await asyncpg.connect(url, timeout=30) for _ in executors]
    try:
        out.late = time.monotonic() > go
        await asyncio.sleep(max(0.0, go - time.monotonic()))
        await asyncio.gather(
            _cpu_window(start, end, out),
            *(_client(c, sql, ex, start, end, out) if batch_args is None
              else _batch_client(c, sql, batch_args, ex, start, end, out)
              for c, ex in zip(conns, executors, strict=True)),
        )
    finally:
        for c in conns:
            await c.close()
    out.claims = [(t, s, str(tok)) for t, s, tok in out.claims]
    return out


def _worker(pipe: Any, url: str, sql: str, executors: list[uuid.UUID], go: float, start: float,
            end: float, batch_args: tuple[Any, ...] | None) -> None:
    try:
        result = asyncio.run(_worker_main(url, sql, executors, go, start, end, batch_args))
    except BaseException as e:  # reported to the parent, which fails the run
        result = WorkerResult(error=f"{type(e).__name__}: {e}")
    pipe.send(result)
    pipe.close()


async def _sample_waits(url: str, start: float, end: float) -> dict[str, int]:
    """What the run's backends are doing, sampled every 20 ms in the window (pg_stat_activity)."""
    counts: dict[str, int] = {}
    conn = await asyncpg.connect(url, timeout=30)
    try:
        await asyncio.sleep(max(0.0, start - time.monotonic()))
        while time.monotonic() < end:
            for row in await conn.fetch(
                """SELECT CASE WHEN state = 'active' THEN coalesce(wait_event_type || ':' || wait_event, 'CPU')
                               ELSE state || coalesce(' ' || wait_event, '') END AS what, count(*) AS n
                     FROM pg_stat_activity
                    WHERE datname = current_database() AND pid <> pg_backend_pid()
                    GROUP BY 1"""):
                counts[row["what"]] = counts.get(row["what"], 0) + row["n"]
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    return counts


def _sampler(pipe: Any, url: str, start: float, end: float) -> None:
    try:
        pipe.send(asyncio.run(_sample_waits(url, start, end)))
    except BaseException as e:
        pipe.send({f"sampler failed: {type(e).__name__}: {e}": 1})
    pipe.close()


def run_clients(url: str, sql: str, executors: list[uuid.UUID], procs: int, warmup: float,
                seconds: float, waits: dict[str, int] | None = None, batch_args: tuple[Any, ...] | None = None,
                side: tuple[Any, tuple[Any, ...]] | None = None) -> tuple[list[WorkerResult], Any]:
    """Fork `procs` workers sharing the clients, and collect what they measured (and, given `waits`,
    add to it what the server's backends were waiting on). batch_args: `sql` is a batched claim
    (minion_claim_batch's rows) taking these parameters after the executor. side: (target, args) of
    one more process running beside the clients from the warm-up to the window's end, called as
    target(pipe, url, go, end, *args); what it sends back is returned with the workers' results."""
    ctx = mp.get_context("fork")
    shares = [executors[i::procs] for i in range(procs)]
    shares = [s for s in shares if s]
    # Time to fork and connect before the warm-up begins (the monotonic clock is system-wide).
    go = time.monotonic() + 0.4 + 0.05 * len(executors)
    start = go + warmup
    end = start + seconds
    workers = []
    for share in shares:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker, args=(child, url, sql, share, go, start, end, batch_args), daemon=True)
        p.start()
        child.close()
        workers.append((p, parent))
    sampler = None
    if waits is not None:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_sampler, args=(child, url, start, end), daemon=True)
        p.start()
        child.close()
        sampler = (p, parent)
    beside = None
    if side is not None:
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=side[0], args=(child, url, go, end, *side[1]), daemon=True)
        p.start()
        child.close()
        beside = (p, parent)
    results = []
    for p, parent in workers:
        results.append(parent.recv())
        p.join()
    if sampler is not None and waits is not None:
        for k, n in sampler[1].recv().items():
            waits[k] = waits.get(k, 0) + n
        sampler[0].join()
    side_result = None
    if beside is not None:
        side_result = beside[1].recv()
        beside[0].join()
    for r in results:
        if r.error:
            raise RuntimeError(f"a benchmark worker failed: {r.error}")
    return results, side_result


# --- the check -----------------------------------------------------------------------------------------


async def verify(url: str, arm: str, results: list[WorkerResult]) -> tuple[int, int]:
    """No subtask leased twice; returns how many leases the run made and how many subtasks are
    still pending."""
    claims = [c for r in results for c in r.claims]
    keys = {(t, s) for t, s, _ in claims}
    tokens = {tok for _, _, tok in claims}
    assert len(keys) == len(claims), f"{arm}: a subtask was handed out twice ({len(claims) - len(keys)})"
    assert len(tokens) == len(claims), f"{arm}: a lease token was handed out twice"
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            """SELECT count(*) AS leased, count(DISTINCT lease_token) AS tokens,
                      count(*) FILTER (WHERE attempts <> 1) AS not_once,
                      (SELECT count(*) FROM subtasks WHERE state NOT IN ('pending', 'leased')) AS other
                 FROM subtasks WHERE state = 'leased'""")
        assert row["leased"] == len(claims), f"{arm}: {row['leased']} leased subtasks, {len(claims)} claims"
        assert row["tokens"] == row["leased"], f"{arm}: leased subtasks share a token"
        assert row["not_once"] == 0, f"{arm}: {row['not_once']} subtasks leased more than once"
        assert row["other"] == 0, f"{arm}: subtasks in unexpected states"
        leased = await conn.fetch("SELECT lease_token FROM subtasks WHERE state = 'leased'")
        db_tokens = {str(r["lease_token"]) for r in leased}
        assert db_tokens == tokens, f"{arm}: the leased subtasks' tokens differ from the claims'"
        acq = await conn.fetchrow(
            """SELECT count(*) AS rows, count(DISTINCT (a.task_id, a.subtask_id)) AS subtasks,
                      count(s.task_id) AS matching
                 FROM minion_subtask_acquirement a
                 LEFT JOIN subtasks s ON s.task_id = a.task_id AND s.subtask_id = a.subtask_id
                       AND s.state = 'leased' AND s.lease_token = a.lease_token
                       AND s.lease_executor = a.executor_id""")
        if arm != "reference":
            assert acq["rows"] == row["leased"], f"{arm}: {acq['rows']} acquirements, {row['leased']} leases"
            assert acq["subtasks"] == acq["rows"], f"{arm}: two acquirements for one subtask"
            assert acq["matching"] == acq["rows"], f"{arm}: an acquirement does not match its lease"
        else:
            assert acq["rows"] == 0, "reference: it should not touch the referee table"
        pending = await conn.fetchval("SELECT count(*) FROM subtasks WHERE state = 'pending'")
        return len(claims), pending
    finally:
        await conn.close()


# --- a run's figures -----------------------------------------------------------------------------------


@dataclass
class RunResult:
    arm: str
    clients: int
    rate: float
    latencies: list[float]
    cpu: list[float]          # per worker process: CPU seconds / window seconds
    drained: bool
    leases: int


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]
