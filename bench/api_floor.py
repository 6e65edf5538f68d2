"""The API's CPU per request at its floors, beside the protocol's claim and complete, on one set of real
services (API with its workers, splitter, watchdog; bench/drain.py's harness), alternating, medians:

    python bench/api_floor.py [--requests 8000] [--subtasks 4000] [--clients 16] [--runs 3]

  meta      GET /api/v1/meta with an executor token: the middlewares, routing and the token's check
            (cached), no query: what any authenticated request costs before its handler works.
  health    GET /api/v1/health, public: routing and one trivial query through the pool (no token).
  inline1   bench/drain.py's http-inline1 drain: claim (no `max`) with the input inline, then complete
            with the output inline, `--clients` simulated executors (the agent's ExecutorClient); per
            request, two a subtask.

CPU is read from /proc for the API's processes and for this process (the clients), over each phase,
divided by its requests: on a 2-vCPU machine it is CPU, not waiting, that sets a drain's pace, so the
gap between a floor and the protocol's requests is what a leaner handler could win at most.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench.drain import (  # noqa: E402
    CpuMeter,
    prepare_template,
    running_services,
    scratch,
    sim_executor,
    sim_executors,
    sleep_records,
    submit_sleep_task,
)
from bench.scratch import scratch_postgres  # noqa: E402
from minions import runtime  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402
from minions.testing.processes import Services  # noqa: E402


async def hammer(base: str, path: str, token: str | None, requests: int, clients: int) -> int:
    """GETs `path` about `requests` times from `clients` sessions; the requests made."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def client(n: int) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                async with session.get(base + path, headers=headers) as response:
                    assert response.status == 200, (path, response.status)
                    await response.read()

    await asyncio.gather(*(client(requests // clients) for _ in range(clients)))
    return requests // clients * clients


def cpu_us(meter: CpuMeter, requests: int) -> dict[str, float]:
    spent = meter.spent()
    return {name: spent[name] / requests * 1e6 for name in ("api", "bench")}


async def drain_phase(server: EmbeddedPostgres, services: Services, admin_token: str, executor_token: str,
                      args: argparse.Namespace, round_: int) -> dict[str, float]:
    conn = await connect(services.database_url)
    records = sleep_records(args.subtasks, 0)
    await submit_sleep_task(services, admin_token, conn, f"floor-{round_}", records)
    await conn.close()
    async with contextlib.AsyncExitStack() as stack:
        clients, ids = await sim_executors(stack, services, executor_token, args.clients, f"floor-{round_}")
        meter = CpuMeter(server, services)
        done = await asyncio.gather(*(sim_executor(c, e, 0) for c, e in zip(clients, ids, strict=True)))
        assert sum(done) == args.subtasks, (sum(done), args.subtasks)
        return cpu_us(meter, 2 * args.subtasks)


async def run(server: EmbeddedPostgres, root: Path, args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    await prepare_template(server)
    _, url = await scratch(server)
    args.workdir = str(root)
    out: dict[str, list[dict[str, float]]] = {"meta": [], "health": [], "inline1": []}
    async with running_services(url, args) as (services, admin_token, executor_token):
        floors = {"meta": ("/api/v1/meta", executor_token), "health": ("/api/v1/health", None)}
        for path, token in floors.values():  # warm: the token cached, the pool's connections open
            await hammer(services.api_url, path, token, args.clients * 20, args.clients)
        for round_ in range(args.runs):
            for phase, (path, token) in floors.items():
                meter = CpuMeter(server, services)
                started = time.perf_counter()
                made = await hammer(services.api_url, path, token, args.requests, args.clients)
                out[phase].append(cpu_us(meter, made))
                print(f"run {round_ + 1} {phase:8s} {made / (time.perf_counter() - started):7.0f} req/s, "
                      f"API {out[phase][-1]['api']:.0f} us/request", flush=True)
            out["inline1"].append(await drain_phase(server, services, admin_token, executor_token, args, round_))
            print(f"run {round_ + 1} inline1  API {out['inline1'][-1]['api']:.0f} us/request", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=8000, help="per floor phase")
    p.add_argument("--subtasks", type=int, default=4000, help="per inline1 phase (two requests each)")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--api-workers", type=int, default=2, help="`minions api --workers`")
    args = p.parse_args(argv)
    with scratch_postgres("minions-bench-apifloor-") as (server, root):
        results = runtime.run(run(server, root, args))
    print("\n| phase | API CPU us/request (median) | runs | clients' CPU us/request (median) |\n|---|---:|---|---:|")
    for phase, runs in results.items():
        api = [r["api"] for r in runs]
        print(f"| {phase} | {statistics.median(api):.0f} | {', '.join(f'{x:.0f}' for x in api)} | "
              f"{statistics.median(r['bench'] for r in runs):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
