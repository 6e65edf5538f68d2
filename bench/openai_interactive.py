"""The interactive lane's overhead: POST /v1/embeddings end to end, less the executor's own compute.

    python bench/openai_interactive.py [--requests 200] [--warmup 10]

Real services over a PostgreSQL of the bench's own, one real agent (`--kind embedding`, the bundled
MiniLM, 1 thread) kept busy with nothing else. Requests go one at a time (the lane is for latency,
not throughput), each one sentence, through aiohttp as a pipeline's HTTP client would. For each:
latency (request sent to response read), the executor's compute (`seconds` the agent reported at
complete, from subtask_attempts: its runner's time for the subtask, input fetch to output ready), and
overhead = latency - compute: the task insert and split, the claim's wake-up, the store round trips,
the complete, the NOTIFY back to the handler and the answer. Prints p50 and p99 of each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

import aiohttp  # noqa: E402

from minions.db.connect import connect  # noqa: E402
from minions.sample import sentences  # noqa: E402
from minions.testing.cluster import Cluster, DedicatedPostgres, eventually  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(args: argparse.Namespace) -> int:
    pg = DedicatedPostgres()
    url = await pg.start()
    workdir = Path(tempfile.mkdtemp(prefix="minions-bench-openai-"))
    cluster = await Cluster.create(url, workdir,
                                   heartbeat_interval_s=1.0, lease_timeout_s=10.0, long_poll_s=30.0)
    texts = sentences(args.warmup + args.requests, 3)
    latencies: list[float] = []
    try:
        await cluster.services.start_all()
        cluster.fleet.start("bench", "--threads", "1", kinds=("embedding",))

        async def registered() -> bool:
            return any(e["name"] == "bench" for e in await cluster.client.executors())

        await eventually(registered, "the agent to register", 120)
        headers = {"Authorization": f"Bearer {cluster.admin_token}"}
        async with aiohttp.ClientSession(headers=headers) as http:
            for i, text in enumerate(texts):
                started = time.perf_counter()
                async with http.post(f"{cluster.services.api_url}/v1/embeddings",
                                     json={"model": MODEL, "input": text, "encoding_format": "float"}) as r:
                    body = await r.read()
                    assert r.status == 200, body
                if i >= args.warmup:
                    latencies.append(time.perf_counter() - started)
        conn = await connect(url)
        try:
            rows = await conn.fetch("""SELECT a.seconds FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
                                        WHERE t.project = 'interactive' AND a.outcome = 'done'
                                        ORDER BY t.id""")
        finally:
            await conn.close()
    finally:
        await cluster.close()
        pg.close()
        shutil.rmtree(workdir, ignore_errors=True)
    compute = [float(r["seconds"]) for r in rows][args.warmup:]
    assert len(compute) == len(latencies), (len(compute), len(latencies))
    overhead = [lat - c for lat, c in zip(latencies, compute, strict=True)]
    print(f"{args.requests} requests, one at a time, one sentence each ({os.cpu_count()} CPUs)")
    for name, values in (("latency", latencies), ("executor compute", compute), ("overhead", overhead)):
        print(f"{name:17}: p50 {pct(values, 0.5) * 1000:6.1f} ms  p99 {pct(values, 0.99) * 1000:6.1f} ms  "
              f"mean {statistics.fmean(values) * 1000:6.1f} ms")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
