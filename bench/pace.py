"""The pace guard: does the agent's pipeline still hide its round trips behind the device's work?

    python bench/pace.py [--subtasks 1000] [--ms 5] [--rounds 2] [--min-hidden 0.8] [--agent-from REV ...]

One set of real services (API, splitter, watchdog as processes, embedded PostgreSQL, a local-folder
store) and, arm by arm, alternating, ONE real agent process draining a task of `--subtasks`
one-record `sleep` subtasks of `--ms` each:

  pipelined  the agent as it ships: claim-ahead as deep as its measured round trips call for
             (agents/macos/claim_depth.py); with `--agent-from REV` (repeatable), one such arm per
             revision, its agent from a worktree of it (bench/revision.py) against these services
  serial     the same agent with `--max-leases 1`: claim, run, complete, one subtask at a time

The figure is each arm's makespan (the task's finished_at - created_at, as PostgreSQL recorded them)
beside the limit, the pure compute time (subtasks x ms). What the guard checks is a ratio between the
two arms of one run, which holds on a noisy machine where an absolute time does not: the share of the
serial arm's time beyond compute (its round trips, which nothing hides) that the pipelined arm hid,

    hidden = (serial - pipelined) / (serial - compute)

It exits 1 when `hidden` of a pipelined arm (medians over the rounds) is below `--min-hidden`. The
pipeline hid 93% on a 2-CPU AMD EPYC in the run that introduced this guard; the commit it was written
to catch (a3bf2a5, "claim ahead only as deep as the subtasks' duration calls for") hid 66%
(`--agent-from a3bf2a5`), the one before it 93%. Part of `make bench`, and quick enough (about 45 s)
to run on every change to the agent's loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

import asyncpg  # noqa: E402

from bench import limits, machine, revision  # noqa: E402
from bench.drain import check_end_state, prepare_template, running_services, scratch, sleep_records  # noqa: E402
from bench.drain import submit_sleep_task as submit  # noqa: E402
from bench.scratch import scratch_postgres  # noqa: E402
from minions import runtime  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.testing.agents import IMPORT_ROOT, AgentFleet  # noqa: E402
from minions.testing.processes import Services  # noqa: E402

ARMS = ("pipelined", "serial")


@dataclass(frozen=True)
class Arm:
    name: str
    root: Path  # the checkout its agent runs from
    args: tuple[str, ...]  # the agent's extra arguments


async def drain_once(services: Services, token: str, admin_token: str, conn: asyncpg.Connection, arm: Arm,
                     label: str, args: argparse.Namespace) -> float:
    """One agent process of `arm` drains a fresh task; its makespan, seconds."""
    fleet = AgentFleet(services, token, root=arm.root)
    agent = fleet.start(label, *arm.args)
    try:
        deadline = time.monotonic() + 60
        while not await conn.fetchval("SELECT count(*) FROM executors WHERE name = $1 AND status = 'online'", label):
            if agent.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent {label} never registered:\n{agent.log()[-3000:]}")
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # in its long poll
        task_id = await submit(services, admin_token, conn, label, sleep_records(args.subtasks, args.ms))
        await check_end_state(conn, task_id, args.subtasks, wait_s=600)
        makespan = await conn.fetchval(
            "SELECT extract(epoch FROM finished_at - created_at) FROM tasks WHERE id = $1", task_id)
        return float(makespan)
    except BaseException:
        print(fleet.logs(), file=sys.stderr)
        raise
    finally:
        fleet.stop_all()


async def measure(arms: list[Arm], args: argparse.Namespace) -> dict[str, list[float]]:
    spans: dict[str, list[float]] = {arm.name: [] for arm in arms}
    compute = args.subtasks * args.ms / 1000
    with scratch_postgres("minions-bench-pace-") as (server, root):
        await prepare_template(server)
        _, url = await scratch(server)
        services_args = argparse.Namespace(workdir=str(root), api_workers=os.cpu_count() or 1)
        conn = await connect(url)
        try:
            async with running_services(url, services_args) as (services, admin_token, token):
                for n in range(args.rounds):
                    for arm in arms:
                        label = re.sub(r"[^A-Za-z0-9._-]", "_", f"{arm.name}-{n}")  # a task and executor name
                        span = await drain_once(services, token, admin_token, conn, arm, label, args)
                        spans[arm.name].append(span)
                        print(f"round {n + 1} {arm.name:10s} {span:7.2f} s = {span / compute:.2f}x compute",
                              flush=True)
        finally:
            await conn.close()
    return spans


def hidden_share(pipelined: float, serial: float, compute: float) -> float:
    """The share of the serial arm's time beyond compute that the pipelined arm hid."""
    beyond = serial - compute
    return (serial - pipelined) / beyond if beyond > 0 else 1.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subtasks", type=int, default=1000, help="one-record sleep subtasks per drain")
    p.add_argument("--ms", type=int, default=5, help="each subtask sleeps this long")
    p.add_argument("--rounds", type=int, default=2, help="rounds of the two arms, alternating")
    p.add_argument("--min-hidden", type=float, default=0.8,
                   help="fail below this share of the serial arm's round trips hidden by the pipeline")
    p.add_argument("--agent-from", metavar="REV", action="append", default=[],
                   help="a pipelined arm whose agent runs from this git revision (a temporary worktree); "
                        "repeatable; without it, the pipelined arm is this tree's agent")
    args = p.parse_args(argv)
    if args.subtasks < 1 or args.ms < 1 or args.rounds < 1:
        p.error("--subtasks, --ms and --rounds must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    compute = args.subtasks * args.ms / 1000
    with contextlib.ExitStack() as stack:
        pipelined = [Arm(f"pipelined@{rev}", stack.enter_context(revision.checkout(rev)), ())
                     for rev in args.agent_from] or [Arm("pipelined", IMPORT_ROOT, ())]
        print(f"# pace: {machine.describe()}; {args.subtasks} x {args.ms} ms sleep subtasks, one agent, "
              f"{args.rounds} rounds alternating; pipelined against serial (--max-leases 1)", flush=True)
        for rev in args.agent_from:
            print(f"#   pipelined@{rev}: the agent of {revision.describe(rev)}", flush=True)
        arms = [*pipelined, Arm("serial", IMPORT_ROOT, ("--max-leases", "1"))]
        spans = runtime.run(measure(arms, args))
    medians = {name: statistics.median(runs) for name, runs in spans.items()}
    serial = medians["serial"]
    print()
    print("| arm | makespan (median) | limit: compute | ratio to the limit | hidden (target) | runs |")
    print("|---|---:|---:|---:|---:|---|")
    failed = []
    for name, median in medians.items():
        runs = ", ".join(f"{s:.2f}" for s in spans[name])
        hidden = ""
        if name != "serial":
            share = hidden_share(median, serial, compute)
            hidden = f"{share:.0%} (>= {args.min_hidden:.0%})"
            if share < args.min_hidden:
                failed.append(f"{name} hid {share:.0%}")
        print(f"| {name} | {median:.2f} s | {compute:.2f} s | {median / compute:.2f}x | {hidden} | {runs} |")
    print()
    for name, median in medians.items():
        if name != "serial":
            limits.report(limits.Ratio("bench/pace.py", f"{args.subtasks} x {args.ms} ms sleep subtasks, {name}: "
                                       "share of the round trips hidden", "the serial arm's time beyond compute",
                                       hidden_share(median, serial, compute), args.min_hidden, at_least=True,
                                       machine=machine.describe()))
    print()
    print(f"pace: hidden = the share of the serial arm's {serial - compute:.2f} s beyond compute that a pipelined "
          f"arm hid: {'FAIL: ' + ', '.join(failed) if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
