"""The churn example, time-scaled 1/300: how much a burst of executor deaths costs a task.

    python bench/churn.py [--runs 3] [--executors agents|inprocess] [--agents 20] [--kill 5]

1,200 subtasks of one record {"ms": 100} each (subtask_size 1), 20 executors, heartbeat 1 s,
lease timeout 3 s. Each "churn" run kills -9 five executors 2 s after the task is submitted; each
"calm" run kills nobody. Runs alternate (calm, churn, calm, churn, ...) against the same services
and database, and the fleet is topped up to 20 live executors before every run. The script prints
the median makespan of each arm, their ratio (the paper's arithmetic: ≈ 1.23; target ≤ 1.30), and
how many subtasks the killed executors held at the moment of the kills, with how long the watchdog
took to give them back.

The check (exit 1 when it fails): each killed executor held no more leases than its claim-ahead rule
allowed. An agent claims ahead only as deep as its subtasks' duration calls for
(agents/macos/claim_depth.py): ceil((round trip + claim) / run time) + 1 leases, at least 2 (one
running, one ready), at most what it finishes in one heartbeat interval; it logs each depth it chooses
(`claim_depth`, with the run time, round trip and claim time it measured), and the bench recomputes the rule from
those figures and allows, per agent, the deepest it chose between the submission and the kill. So
subtasks longer than the round trips (the seed's 30 s) strand at most 2 each; 100 ms ones may pipeline
a little deeper on a slow API. A test executor (`--executors inprocess`) holds one lease at a time.

Executors are real agent processes (`python -m minions.agents.macos --kind sleep`) by default; with
`--executors inprocess` they are the drills' test executors (minions/testing/drill_executors.py:
one process, asyncio tasks; a kill cancels one mid-subtask without a word to the server). Every run ends with the chaos
drills' audit (minions/testing/audit.py): every record exactly once, in order; attempt history
explains every retry.

The makespan is the task's own: finished_at - created_at, as PostgreSQL recorded them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench import limits, machine, revision  # noqa: E402
from bench.machine import cpu_model  # noqa: E402
from minions.agents.macos.claim_depth import MIN_DEPTH, depth_for  # noqa: E402
from minions.testing.audit import audit  # noqa: E402
from minions.testing.cluster import (  # noqa: E402
    Cluster,
    DedicatedPostgres,
    eventually,
    log_events,
    sleep_records,
)
from minions.testing.drill_executors import DrillExecutor  # noqa: E402
from minions.testing.processes import IMPORT_ROOT  # noqa: E402

THIS_TREE = "this tree"


@dataclass
class Victim:
    """A killed executor: the leases it held at the kill, and the most its rule allowed."""

    name: str
    held: int
    bound: int
    why: str  # the figures the bound was worked out from

    @property
    def ok(self) -> bool:
        return self.held <= self.bound


@dataclass
class RunResult:
    arm: str  # calm | churn
    rev: str  # the agents' revision (`this tree` without --agent-from)
    makespan_s: float
    stuck: int = 0  # subtasks the killed executors held at the moment of the kills
    victims: list[Victim] = field(default_factory=list)
    reclaimed_after_s: float = 0.0  # from the kills to the last of those being given back
    lost_attempts: int = 0


class InProcessFleet:
    """Test executors as asyncio tasks of this process; `kill` cancels one mid-whatever."""

    def mark(self) -> dict[str, int]:
        return {}

    def bound(self, name: str, mark: dict[str, int]) -> tuple[int, str]:
        return 1, "a test executor holds one lease at a time"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.stop = asyncio.Event()
        self.running: dict[str, tuple[DrillExecutor, asyncio.Task[None]]] = {}
        self.started = 0

    async def top_up(self, n: int) -> None:
        while len(self.running) < n:
            name = f"exec-{self.started:03d}"
            self.started += 1
            executor = DrillExecutor(self.cluster.services.api_url, self.cluster.executor_token, name)
            self.running[name] = (executor, asyncio.create_task(executor.run(self.stop, wait_s=5)))
        await eventually(self._registered, "executors to register", timeout=60)

    async def _registered(self) -> bool:
        return all(e.executor_id for e, _ in self.running.values())

    def names(self) -> list[str]:
        return list(self.running)

    def kill(self, name: str) -> None:
        _, task = self.running.pop(name)
        task.cancel()

    async def close(self) -> None:
        self.stop.set()
        for _, task in self.running.values():
            task.cancel()
        await asyncio.gather(*(t for _, t in self.running.values()), return_exceptions=True)


class AgentFleet:
    """Real agent processes; `kill` is kill -9."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def run_from(self, root: Path) -> None:
        """Agents from now on run from the checkout `root` (another revision's, `--agent-from`): the
        live ones are stopped, and the next top-up starts them anew from there."""
        if self.cluster.fleet.root != root:
            self.cluster.fleet.stop_all()
            self.cluster.fleet.root = root

    async def top_up(self, n: int) -> None:
        missing = n - len(self.cluster.alive_agents())
        if missing > 0:
            await self.cluster.start_agents(missing, prefix=f"agent{len(self.cluster.fleet.agents):03d}")

    def names(self) -> list[str]:
        return [a.name for a in self.cluster.alive_agents()]

    def mark(self) -> dict[str, int]:
        """Where each agent's log stands now (the submission): its depth from then on is read after it."""
        return {a.name: len(a.log()) for a in self.cluster.alive_agents()}

    def bound(self, name: str, mark: dict[str, int]) -> tuple[int, str]:
        """The deepest claim-ahead agent `name` chose since `mark` (the one in effect then included),
        each depth checked against the rule recomputed from the figures it logged."""
        text = self.cluster.agent(name).log()
        at = mark.get(name, 0)
        chosen = log_events(text[:at], "claim_depth")[-1:] + log_events(text[at:], "claim_depth")
        if not chosen:
            return MIN_DEPTH, "nothing measured yet"
        for event in chosen:
            rule = depth_for(event["run_s"], event["round_trip_s"], event.get("claim_s"), event["cap"])
            if rule != event["leases"]:
                raise AssertionError(f"{name} chose {event['leases']} leases where the rule says {rule}: {event}")
        deepest = max(chosen, key=lambda e: e["leases"])
        return int(deepest["leases"]), _explain(deepest)

    def kill(self, name: str) -> None:
        self.cluster.agent(name).kill()

    async def close(self) -> None:
        self.cluster.fleet.stop_all()


def _explain(event: dict[str, object]) -> str:
    run_s, round_trip_s, cap = event["run_s"], event["round_trip_s"], event["cap"]
    claim_s = event.get("claim_s") or 0.0
    if not isinstance(run_s, int | float) or not isinstance(round_trip_s, int | float):
        return f"not measured yet: {MIN_DEPTH}"
    assert isinstance(claim_s, int | float)
    return (f"run {run_s:.3f} s, round trip {round_trip_s:.3f} s, claim {claim_s:.3f} s: "
            f"max({MIN_DEPTH}, min(ceil(({round_trip_s:.3f} + {claim_s:.3f}) / {run_s:.3f}) + 1, cap {cap}))")


async def one_run(cluster: Cluster, fleet: AgentFleet | InProcessFleet, args: argparse.Namespace, arm: str,
                  index: int, rev: str) -> RunResult:
    await fleet.top_up(args.agents)
    await asyncio.sleep(1.0)  # every executor back in its long poll
    name = f"{arm}-{index}-{len(cluster.fleet.agents)}"
    records = sleep_records(args.subtasks, ms=args.ms)
    mark = fleet.mark()
    submitted = time.monotonic()
    await cluster.submit(name, records, subtask_size=1)
    result = RunResult(arm, rev, 0.0)
    if arm == "churn":
        await asyncio.sleep(max(0.0, args.kill_at - (time.monotonic() - submitted)))
        victims = fleet.names()[: args.kill]
        for victim in victims:
            fleet.kill(victim)
        killed_at = time.monotonic()
        held = await cluster.holders(name)
        tokens = [token for victim in victims for _, token in held.get(victim, [])]
        result.stuck = len(tokens)
        for victim in victims:
            bound, why = fleet.bound(victim, mark)
            result.victims.append(Victim(victim, len(held.get(victim, [])), bound, why))
    task = await cluster.wait_finished(name, timeout=300)
    result.makespan_s = (datetime.fromisoformat(task["finished_at"])
                         - datetime.fromisoformat(task["created_at"])).total_seconds()
    report = await audit(cluster, name, records)
    result.lost_attempts = report.outcomes["lost"]
    if arm == "churn" and result.stuck:
        conn = await cluster.db()
        try:
            last_reclaim = await conn.fetchval(
                """SELECT max(ended_at) FROM subtask_attempts
                    WHERE lease_token = ANY($1::uuid[]) AND outcome = 'lost'""", tokens)
            last_kill_db = await conn.fetchval("SELECT now() - make_interval(secs => $1)",
                                               time.monotonic() - killed_at)
        finally:
            await conn.close()
        if last_reclaim is not None:
            result.reclaimed_after_s = (last_reclaim - last_kill_db).total_seconds()
    return result


def paper_ratio(args: argparse.Namespace) -> float:
    """The ideal arithmetic: no overhead, perfect sharing, the stuck subtasks' retries negligible."""
    per = args.ms / 1000
    calm = args.subtasks * per / args.agents
    done_at_kill = args.agents * args.kill_at / per
    churn = args.kill_at + (args.subtasks - done_at_kill) * per / (args.agents - args.kill)
    return float(churn / calm)




async def main(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as stack:
        revs = {rev: stack.enter_context(revision.checkout(rev)) for rev in args.agent_from}
        return await drill(args, revs or {THIS_TREE: IMPORT_ROOT})


async def drill(args: argparse.Namespace, revs: dict[str, Path]) -> int:
    """The runs, alternating calm and churn, and (with --agent-from) the agents' revisions within
    each run: the fleet is started anew from a revision's checkout before its runs."""
    pg = DedicatedPostgres()
    url = await pg.start()
    workdir = Path(tempfile.mkdtemp(prefix="minions-churn-"))
    cluster = await Cluster.create(url, workdir, heartbeat_interval_s=args.heartbeat,
                                   lease_timeout_s=args.lease_timeout, long_poll_s=5.0)
    fleet: AgentFleet | InProcessFleet = (AgentFleet(cluster) if args.executors == "agents"
                                          else InProcessFleet(cluster))
    results: list[RunResult] = []
    try:
        await cluster.services.start_all()
        for i in range(args.runs):
            for rev, root in revs.items():
                if isinstance(fleet, AgentFleet):
                    fleet.run_from(root)
                for arm in ("calm", "churn"):
                    r = await one_run(cluster, fleet, args, arm, i, rev)
                    results.append(r)
                    extra = (f", stuck at the kills {r.stuck}, given back {r.reclaimed_after_s:.2f} s after"
                             if arm == "churn" else "")
                    print(f"run {i + 1} {_label(rev)}{arm:5}: makespan {r.makespan_s:.2f} s, "
                          f"lost attempts {r.lost_attempts}{extra}", flush=True)
                    for v in r.victims:
                        print(f"    killed {v.name}: held {v.held}, rule's bound {v.bound} ({v.why})"
                              f"{'' if v.ok else '  <-- over the bound'}", flush=True)
    finally:
        await fleet.close()
        await cluster.close()
        pg.close()
    print()
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; executors: {args.executors} ({args.agents}); "
          f"{args.subtasks} subtasks x {args.ms} ms; kill {args.kill} at {args.kill_at:g} s; "
          f"heartbeat {args.heartbeat:g} s, lease timeout {args.lease_timeout:g} s; {args.runs} runs per arm")
    over = [v for r in results for v in r.victims if not v.ok]
    for rev in revs:
        mine = [r for r in results if r.rev == rev]
        calm = statistics.median(r.makespan_s for r in mine if r.arm == "calm")
        churn = statistics.median(r.makespan_s for r in mine if r.arm == "churn")
        stuck = [r.stuck for r in mine if r.arm == "churn"]
        bounds = [sum(v.bound for v in r.victims) for r in mine if r.arm == "churn"]
        if rev != THIS_TREE:
            print(f"agents from {revision.describe(rev)}:")
        print(f"median makespan: calm {calm:.2f} s, churn {churn:.2f} s; ideal calm "
              f"{args.subtasks * args.ms / 1000 / args.agents:.2f} s")
        print(f"ratio churn / calm: {churn / calm:.3f} (paper's arithmetic {paper_ratio(args):.3f}; target <= 1.30)")
        if rev == THIS_TREE:
            limits.report(limits.Ratio("bench/churn.py", f"{args.subtasks} x {args.ms} ms, {args.kill} of "
                                       f"{args.agents} agents killed: makespan", "the calm runs' makespan",
                                       churn / calm, 1.30, at_least=False, machine=machine.describe()))
        print(f"stuck at the kills: {stuck}; the claim-ahead rule's bounds for the killed executors: {bounds} "
              f"(per executor: ceil((round trip + claim) / run time) + 1 leases, at least {MIN_DEPTH}, at most one "
              f"heartbeat's work)")
    if over:
        print(f"over the bound: {', '.join(f'{v.name} held {v.held} > {v.bound}' for v in over)}")
    return 0 if not over else 1


def _label(rev: str) -> str:
    return "" if rev == THIS_TREE else f"[{rev}] "


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--runs", type=int, default=3, help="runs per arm (calm and churn alternate)")
    p.add_argument("--executors", choices=("agents", "inprocess"), default="agents")
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--subtasks", type=int, default=1200)
    p.add_argument("--ms", type=int, default=100, help="each subtask's one record sleeps this long")
    p.add_argument("--kill", type=int, default=5, help="executors killed -9 in a churn run")
    p.add_argument("--kill-at", type=float, default=2.0, help="seconds after submission")
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--lease-timeout", type=float, default=3.0)
    p.add_argument("--agent-from", metavar="REV", action="append", default=[],
                   help="run the agents from this git revision (a temporary worktree; repeatable: the "
                        "revisions alternate within each run)")
    args = p.parse_args(argv)
    if args.agent_from and args.executors != "agents":
        p.error("--agent-from needs --executors agents")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
