"""An embedding task through the whole system against the runner's own speed, side by side (the
target: with one agent, >= 0.9x the runner's speed from bench/embed_agent.py).

    python bench/embed_system.py [--sentences 2000] [--rounds 3] [--threads 2] [--subtask-size 500]
                                 [--device cpu|cuda|mps]

One embedded PostgreSQL, the real services (API, splitter, watchdog as processes, local-folder
store) and ONE real agent process (`python -m minions.agents.macos --kind embedding`, pipelined,
batched claims) with `--threads` torch threads, on `--device` (the runner arm on the same device).
Arms, alternating within each round (this machine is
shared and noisy, so only side-by-side numbers compare), each figure the median of the rounds:

  runner  the agent's EmbeddingRunner in this process (as bench/embed_agent.py's "agent" arm runs
          it: every sentence in one call, the same model, precision choice and batch size), while
          the agent process sits idle in its long poll.
  system  the same sentences submitted through the API as a task (subtasks of `--subtask-size`, the
          kind's default), drained by the agent: the task's created_at -> finished_at (submit to
          completed, the database's clock), results read back through the API and checked (every
          id once, in input order; cosine >= 0.9999 to the runner's vectors).

Both arms are warm: before the rounds the runner embeds the sentences once and the agent drains a
small warm-up task, so neither pays the model's load (an agent in a fleet has its model loaded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench import limits, machine  # noqa: E402
from bench.drain import PROJECT, TEAM, check_end_state, running_services  # noqa: E402
from bench.embed_agent import MODEL, agent_subtask, sentences  # noqa: E402
from bench.scratch import scratch_postgres  # noqa: E402
from minions.agents.macos.runners.embedding import EmbeddingRunner  # noqa: E402
from minions.agents.macos.runners.torch_setup import TorchSettings  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402
from minions.sdk import MinionsClient  # noqa: E402
from minions.testing.agents import AgentFleet  # noqa: E402


async def submit_and_wait(api_url: str, admin_token: str, conn: Any, name: str, records: list[dict[str, Any]],
                          subtask_size: int, timeout_s: float) -> tuple[float, list[dict[str, Any]]]:
    """The task's submit -> completed seconds (database clock) and its results, checked for order."""
    async with MinionsClient(api_url, admin_token) as client:
        await client.submit({"team": TEAM, "project": PROJECT, "name": name, "kind": "embedding", "model": MODEL,
                             "input": {"records": records}, "subtask_size": subtask_size})
        deadline = time.monotonic() + timeout_s
        while True:
            task_id = await conn.fetchval("SELECT id FROM tasks WHERE team = $1 AND project = $2 AND name = $3 "
                                          "AND finished_at IS NOT NULL", TEAM, PROJECT, name)
            if task_id is not None:
                break
            assert time.monotonic() < deadline, f"task {name} did not finish in {timeout_s} s"
            await asyncio.sleep(0.05)
        subtasks = -(-len(records) // subtask_size)
        await check_end_state(conn, task_id, subtasks)
        span = await conn.fetchval("SELECT extract(epoch FROM finished_at - created_at) FROM tasks WHERE id = $1",
                                   task_id)
        body = b"".join([chunk async for chunk in client.results(TEAM, PROJECT, name)])
    import orjson

    results = [orjson.loads(line) for line in body.splitlines() if line.strip()]
    assert [r["id"] for r in results] == [r["id"] for r in records], "results out of order or missing"
    return float(span), results


def min_cosine(a: list[list[float]], b: list[list[float]]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return float(np.min(np.sum(x * y, axis=1)))


async def run(args: argparse.Namespace, server: EmbeddedPostgres) -> dict[str, list[float]]:
    import torch

    torch.set_num_threads(args.threads)
    texts = sentences(args.sentences)
    records = [{"id": i, "text": t} for i, t in enumerate(texts)]
    runner = EmbeddingRunner(TorchSettings(device=args.device, threads=args.threads, precision="auto"))
    sub = agent_subtask(MODEL, len(records), None)
    reference = [v["embedding"] for v in await runner.run(sub, records)]  # warm: model loaded

    await migrate(server.url)
    conn = await connect(server.url)
    rates: dict[str, list[float]] = {"runner": [], "system": []}
    async with running_services(server.url, args) as (services, admin_token, executor_token):
        fleet = AgentFleet(services, executor_token)
        fleet.start("embedder", "--threads", str(args.threads), "--device", args.device, kinds=("embedding",))
        try:
            deadline = time.monotonic() + 180
            while not await conn.fetchval("SELECT count(*) FROM executors WHERE name = 'embedder'"):
                assert time.monotonic() < deadline, fleet.logs()
                await asyncio.sleep(0.2)
            await submit_and_wait(services.api_url, admin_token, conn, "warm-up", records[:20], args.subtask_size,
                                  300)
            for round_no in range(args.rounds):
                arms = ["runner", "system"] if round_no % 2 == 0 else ["system", "runner"]
                for arm in arms:
                    if arm == "runner":
                        started = time.perf_counter()
                        await runner.run(sub, records)
                        seconds = time.perf_counter() - started
                    else:
                        seconds, results = await submit_and_wait(
                            services.api_url, admin_token, conn, f"embed-{round_no}", records, args.subtask_size,
                            600)
                        cosine = min_cosine([r["embedding"] for r in results], reference)
                        assert cosine >= 0.9999, f"system vectors differ from the runner's: min cosine {cosine}"
                    rates[arm].append(len(records) / seconds)
                    print(f"round {round_no + 1} {arm:7s} {len(records) / seconds:8.1f} sentences/s "
                          f"({seconds:.2f} s)", flush=True)
        except BaseException:
            print(fleet.logs(), file=sys.stderr)
            raise
        finally:
            fleet.stop_all()
    await runner.aclose()
    await conn.close()
    return rates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads, the runner's and the agent's")
    p.add_argument("--subtask-size", type=int, default=500, help="records per subtask (the embedding kind's default)")
    p.add_argument("--api-workers", type=int, default=1, help="`minions api --workers` (one agent needs one)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"),
                   help="the runner's and the agent's torch device (the runner arm was hard-wired to cpu)")
    args = p.parse_args(argv)
    with scratch_postgres("minions-bench-embed-") as (server, root):
        args.workdir = str(root)
        rates = asyncio.run(run(args, server))
    median = {arm: statistics.median(v) for arm, v in rates.items()}
    print(f"\n{args.sentences} sentences on {args.device}, {args.threads} torch threads, "
          f"subtasks of {args.subtask_size}, "
          f"median of {args.rounds} alternating rounds")
    print("| arm | sentences/s (median) | rounds |\n|---|---:|---|")
    for arm, values in rates.items():
        print(f"| {arm} | {median[arm]:.1f} | {', '.join(f'{v:.1f}' for v in values)} |")
    print(f"system / runner = {median['system'] / median['runner']:.3f}")
    limits.report(limits.Ratio("bench/embed_system.py", f"{args.sentences} sentences through the system, subtasks of "
                               f"{args.subtask_size}", "the runner alone", median["system"] / median["runner"],
                               0.9, at_least=True, machine=machine.describe()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
