"""Many simulated executors against API replicas behind HAProxy.

    python bench/fleet.py [--executors 1000 2000] [--processes 4] [--subtasks 20000] [--idle-s 20] [--balancers 2]

For each executor count: an embedded PostgreSQL of its own, 3 API replicas behind HAProxy
(infra/haproxy/haproxy.cfg), 2 splitters, 2 watchdogs (tests/chaos/balancer.py), and
`--processes` client processes running the executors as asyncio tasks that speak the real HTTP
protocol through the balancer: register, long-poll claims, heartbeat, PUT output, complete. The
heartbeat interval is scaled so the fleet's heartbeat rate equals 10,000 Macs at 30 s
(interval = 30 s × executors / 10,000).

Recorded per count:
- idle (everyone waiting in a claim): API memory (RSS of the 3 replicas) per 1,000 waiting claims,
  over the same replicas with no executor; database connections (pg_stat_activity) with and
  without executors; statements per second (pg_stat_database xact_commit rate; each is one
  autocommit statement or transaction); heartbeats per second;
- a drain of a `--subtasks`-subtask task (one record of {"ms": 0} each): claims per second and
  claim latency (p50, p99) of claims sent after the submit that returned work;
- errors: any answer other than 200/204 (and connection errors), by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import asyncpg  # noqa: E402
import yarl  # noqa: E402

from minions import jsoncodec  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres, free_port  # noqa: E402
from minions.sdk import MinionsClient, MinionsError  # noqa: E402
from minions.testing.balancer import Balancer, ReplicatedServices  # noqa: E402
from minions.testing.factories import make_tokens  # noqa: E402

MACS, MAC_HEARTBEAT_S = 10_000, 30.0
LONG_POLL_S = 20.0


def _why(status: int, body: bytes) -> str:
    """An error answer's kind: the API's JSON error code, or `lb` for the balancer's own page."""
    try:
        return f"{status} {jsoncodec.loads(body)['error']['code']}"
    except (ValueError, KeyError, TypeError):
        return f"{status} lb"


class SimExecutor:
    """One executor: claim loop plus heartbeat loop, on a session shared by its process."""

    def __init__(self, api: str, token: str, name: str, heartbeat_s: float, stats: dict[str, Any]) -> None:
        self.api, self.name, self.heartbeat_s, self.stats = api, name, heartbeat_s, stats
        self.headers = {"Authorization": f"Bearer {token}"}
        self.executor_id = ""
        self.leases: list[str] = []

    async def run(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        while not self.executor_id and not stop.is_set():
            try:
                async with session.post(f"{self.api}/api/v1/executors/register", headers=self.headers,
                                        json={"name": self.name, "hardware": {"os": "sim", "device": "cpu"},
                                              "kinds": ["sleep"]}) as resp:
                    if resp.status == 201:
                        self.executor_id = (await resp.json())["executor_id"]
                    else:
                        self.stats["errors"][f"register {resp.status}"] += 1
                        await asyncio.sleep(1)
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.stats["errors"][f"register {type(exc).__name__}"] += 1
                await asyncio.sleep(1)
        self.stats["registered"] += 1
        beat = asyncio.create_task(self._beat(session, stop))
        try:
            await self._claims(session, stop)
        finally:
            beat.cancel()

    async def _claims(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        url = f"{self.api}/api/v1/executors/{self.executor_id}/claim"
        while not stop.is_set():
            sent = time.time()
            try:
                async with session.post(url, params={"wait": str(LONG_POLL_S)}, headers=self.headers) as resp:
                    status = resp.status
                    body = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.stats["errors"][f"claim {type(exc).__name__}"] += 1
                await asyncio.sleep(1)
                continue
            if status == 204:
                continue
            if status != 200:
                self.stats["errors"][f"claim {_why(status, body)}"] += 1
                await asyncio.sleep(1)
                continue
            self.stats["claims"].append((sent, time.time() - sent))
            await self._work(session, jsoncodec.loads(body))

    async def _work(self, session: aiohttp.ClientSession, lease: dict[str, Any]) -> None:
        token, sub = lease["lease"]["token"], lease["subtask"]
        self.leases.append(token)
        try:
            start, end = sub["input"]["range"]
            if sub["input"]["url"] is None:  # a task whose input is kept in the database: inline only
                data = sub["input"]["data"].encode()
            else:
                async with session.get(yarl.URL(sub["input"]["url"], encoded=True),
                                       headers={"Range": f"bytes={start}-{end - 1}"}) as resp:
                    data = await resp.read()
            records = [jsoncodec.loads(line) for line in data.splitlines() if line.strip()]
            out = b"".join(jsoncodec.dumps_line({"id": r["id"], "slept_ms": r["ms"]}) for r in records)
            async with session.put(yarl.URL(sub["output"]["url"], encoded=True), data=out) as resp:
                if resp.status != 200:
                    self.stats["errors"][f"put {resp.status}"] += 1
            async with session.post(f"{self.api}/api/v1/leases/{token}/complete", headers=self.headers,
                                    json={"records": len(records), "seconds": 0.001}) as resp:
                await resp.read()
                if resp.status != 200:
                    self.stats["errors"][f"complete {resp.status}"] += 1
                else:
                    self.stats["completed"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.stats["errors"][f"work {type(exc).__name__}"] += 1
        finally:
            self.leases.remove(token)

    async def _beat(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        # Spread the fleet's heartbeats evenly over the interval, as independent Macs would be.
        await asyncio.sleep(self.heartbeat_s * (hash(self.name) % 1000) / 1000)
        while not stop.is_set():
            try:
                async with session.post(f"{self.api}/api/v1/executors/{self.executor_id}/heartbeat",
                                        json={"leases": list(self.leases)}, headers=self.headers) as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        self.stats["heartbeats"] += 1
                    else:
                        self.stats["errors"][f"heartbeat {_why(resp.status, body)}"] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                self.stats["errors"][f"heartbeat {type(exc).__name__}"] += 1
            await asyncio.sleep(self.heartbeat_s)


def _client_process(api: str, token: str, names: list[str], heartbeat_s: float, stop_evt: Any,
                    out: Any, counters: Any) -> None:
    async def main() -> dict[str, Any]:
        stats: dict[str, Any] = {"errors": Counter(), "claims": [], "registered": 0, "completed": 0,
                                 "heartbeats": 0}
        stop = asyncio.Event()
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=LONG_POLL_S + 30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            runs = [asyncio.create_task(SimExecutor(api, token, n, heartbeat_s, stats).run(session, stop))
                    for n in names]
            while not stop_evt.is_set():
                counters["registered"] = counters.get("registered", 0)  # keep the proxy warm
                counters[os.getpid()] = (stats["registered"], stats["completed"], stats["heartbeats"])
                await asyncio.sleep(0.5)
            stop.set()
            for r in runs:
                r.cancel()
            await asyncio.gather(*runs, return_exceptions=True)
        return stats

    stats = asyncio.run(main())
    out.put({"errors": dict(stats["errors"]), "claims": stats["claims"], "completed": stats["completed"],
             "heartbeats": stats["heartbeats"]})


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _db_figures(url: str) -> tuple[int, int]:
    conn = await asyncpg.connect(url)
    try:
        connections = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        commits = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
    finally:
        await conn.close()
    return int(connections), int(commits)


def _log_figures(root: Path) -> dict[str, Any]:
    """How often the balancers took a replica out, and the replicas' commonest warnings."""
    logs = "".join(p.read_text(errors="replace") for p in root.rglob("haproxy*.log"))
    api_logs = "".join(p.read_text(errors="replace") for p in (root / "services").glob("api-*.log"))
    return {"lb_replica_down_events": logs.count(" is DOWN"),
            "api_warnings": dict(Counter(re.findall(r'"event": ?"(\w+)"', api_logs)).most_common(6))}


def _totals(counters: Any) -> tuple[int, int, int]:
    values = [v for k, v in counters.items() if isinstance(k, int)]
    return tuple(sum(v[i] for v in values) for i in range(3))  # type: ignore[return-value]


async def run_count(n: int, args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="minions-fleet-"))
    server = EmbeddedPostgres(root / "pgdata", fast=True)
    server.start()
    conn = await asyncpg.connect(server.url)
    await conn.execute("CREATE DATABASE fleet")
    await conn.close()
    url = server.url_for("fleet")
    await migrate(url)
    heartbeat_s = MAC_HEARTBEAT_S * n / MACS
    # Behind a balancer every connection comes from its address: the API's per-address cap (a
    # slowloris guard, 256 by default) must exceed what one balancer holds to a replica, or the
    # replicas answer the fleet 429 and fail the balancer's own health checks (503 for everyone).
    # The fleet registers under one executor token, all at once: its registration bounds
    # (minion_register_executor_bounded) are raised to fit.
    services = ReplicatedServices(url, root / "services", heartbeat_interval_s=heartbeat_s,
                                  lease_timeout_s=max(4 * heartbeat_s, 10.0), long_poll_s=LONG_POLL_S,
                                  extra_env={"MINIONS_LOG_LEVEL": "warning",
                                             "MINIONS_MAX_CONNECTIONS_PER_IP": str(n + 1000),
                                             "MINIONS_MAX_EXECUTORS_PER_TOKEN": str(n),
                                             "MINIONS_REGISTRATIONS_PER_MINUTE": str(n)},
                                  start_timeout_s=120.0)
    # One process may open at most `ulimit -n` files (20,000 here, and not raisable in this
    # container); a balancer holds two per waiting executor, so 10,000 need two balancers.
    extra_balancers: list[Balancer] = []
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    counters = manager.dict()
    stop_evt = ctx.Event()
    out = ctx.Queue()
    procs: list[Any] = []
    result: dict[str, Any] = {"executors": n, "heartbeat_s": round(heartbeat_s, 2)}
    try:
        admin, token = await make_tokens(url)
        await services.start_all()
        api_urls = [services.api_url]
        for i in range(1, args.balancers):
            port = free_port()
            extra_balancers.append(Balancer(port, services.api_ports, root / f"haproxy-{i + 1}.log").start())
            api_urls.append(f"http://127.0.0.1:{port}")
        await asyncio.sleep(2)
        apis = [services.running[f"api-{i}"].process for i in (1, 2, 3)]
        rss_base = sum(_rss_mb(p.pid) for p in apis if p)
        conns_base, _ = await _db_figures(url)
        names = [f"sim-{i:05d}" for i in range(n)]
        chunks = [names[i::args.processes] for i in range(args.processes)]
        for i, chunk in enumerate(chunks):
            p = ctx.Process(target=_client_process,
                            args=(api_urls[i % len(api_urls)], token, chunk, heartbeat_s, stop_evt, out, counters))
            p.start()
            procs.append(p)
        started = time.monotonic()
        for _ in range(int(args.register_timeout_s)):
            if _totals(counters)[0] >= n:
                break
            await asyncio.sleep(1)
        result["registered"] = _totals(counters)[0]
        result["register_s"] = round(time.monotonic() - started, 1)
        await asyncio.sleep(3)  # everyone inside a long-poll

        # Idle.
        _, commits0 = await _db_figures(url)
        beats0 = _totals(counters)[2]
        t0 = time.monotonic()
        await asyncio.sleep(args.idle_s)
        conns, commits1 = await _db_figures(url)
        beats1 = _totals(counters)[2]
        idle_s = time.monotonic() - t0
        rss = sum(_rss_mb(p.pid) for p in apis if p)
        result |= {
            "api_rss_mb": round(rss, 1), "api_rss_mb_no_executors": round(rss_base, 1),
            "api_mb_per_1000_waiting": round((rss - rss_base) / max(result["registered"], 1) * 1000, 1),
            "db_connections": conns, "db_connections_no_executors": conns_base,
            "idle_commits_per_s": round((commits1 - commits0) / idle_s, 1),
            "heartbeats_per_s": round((beats1 - beats0) / idle_s, 1),
        }

        print("idle:", jsoncodec.dumps_str(result), file=sys.stderr, flush=True)  # kept if the drain hangs

        # Drain. The submit goes through the balancer too, so it may meet a 502/503 of a busy fleet.
        async with MinionsClient(services.api_url, admin, timeout_s=120) as client:
            records = [{"id": f"r{i:06d}", "ms": 0} for i in range(args.subtasks)]
            submitted = time.time()
            for attempt in range(5):
                try:
                    await client.submit({"team": "bench", "project": "fleet", "name": "drain", "kind": "sleep",
                                         "input": {"records": records}, "subtask_size": 1})
                    break
                except MinionsError as exc:
                    result[f"submit_error_{attempt}"] = str(exc)[:80]
                    await asyncio.sleep(2)
            deadline = time.monotonic() + args.drain_timeout_s
            task: dict[str, Any] = {}
            while time.monotonic() < deadline:
                task = await client.task("bench", "fleet", "drain")
                if task["finished_at"]:
                    break
                await asyncio.sleep(1)
        result["drain_finished"] = bool(task.get("finished_at"))
        result["drain_done_subtasks"] = task.get("subtasks", {}).get("done")
        print("drained:", jsoncodec.dumps_str(result), file=sys.stderr, flush=True)
    except BaseException:
        print(services.logs()[-6000:], file=sys.stderr)
        raise
    finally:
        stop_evt.set()
        collected = []
        for _ in procs:
            with contextlib.suppress(Exception):
                collected.append(out.get(timeout=LONG_POLL_S + 10))
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        with contextlib.suppress(OSError):
            result |= _log_figures(root)
        services.stop_all()
        for balancer in extra_balancers:
            balancer.kill()
        server.stop("immediate")
        manager.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    errors: Counter[str] = Counter()
    claims: list[tuple[float, float]] = []
    for c in collected:
        errors.update(c["errors"])
        claims += c["claims"]
    working = sorted(lat for sent, lat in claims if sent >= submitted + 1.0)
    span = [sent for sent, _ in claims if sent >= submitted]
    if working:
        result["claims_per_s"] = round(len(span) / max(max(span) - min(span), 1e-9), 1)
        result["claim_p50_ms"] = round(statistics.median(working) * 1000, 1)
        result["claim_p99_ms"] = round(working[int(0.99 * (len(working) - 1))] * 1000, 1)
    result["errors"] = dict(errors)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--executors", type=int, nargs="+", default=[1000])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--subtasks", type=int, default=5000)
    parser.add_argument("--balancers", type=int, default=1, help="HAProxy instances (2 for 10,000 executors)")
    parser.add_argument("--idle-s", type=float, default=15.0)
    parser.add_argument("--register-timeout-s", type=float, default=120.0)
    parser.add_argument("--drain-timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    for n in args.executors:
        print(jsoncodec.dumps_str(asyncio.run(run_count(n, args))), flush=True)


if __name__ == "__main__":
    main()
