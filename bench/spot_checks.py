"""What replicated spot checks cost: throughput with the default share against share 0,
on the same run, the same database and the same agents.

    python bench/spot_checks.py [--runs 4] [--sentences 2000] [--subtask-size 50] [--sleep-subtasks 400]
                                [--fresh-runs 2] [--quick]

One embedded PostgreSQL, the real services (API, splitter, watchdog as processes, local-folder store)
and real agent processes (`python -m minions.agents.macos`, kinds embedding and sleep, "--threads 1
--precision fp32 --model sentence-transformers/all-MiniLM-L6-v2", the bundled model, offline), one
agent per executor token (`--tokens`, default 2: the first vouched for, as `minions up`'s local
agents' token is, the others volunteers', each its own owner; a vouched agent's leases are never
checked, a volunteer's go to the vouched agent's replica and earn it trust only so). Two arms, alternating within the
run (round 1: zero, default; round 2: default, zero; ...), the services restarted with the arm's
settings before each (the settings are read by the API's and watchdog's sessions at start):

  zero     MINIONS_SPOT_CHECK_SHARE=0, MINIONS_TRUST_AGREEMENTS=0: nothing is ever checked.
  default  the shipped defaults: share 0.02, trust after 5 agreements (MINIONS_QUARANTINE_AFTER 2).

Each arm runs two tasks, one after the other, and each figure is records / (finished_at - created_at),
the database's clock, median of the runs:

  embedding  `--sentences` sentences (minions.sample.embedding_records) in subtasks of `--subtask-size`.
  sleep      `--sleep-subtasks` subtasks of one record {"ms": 0}: no work, so it shows the cost per lease
             (the claim's choice, a held candidate, a replica lease and its vote).

Steady state (the main table): the agents are kept for the whole run. Before the rounds they earn trust
under the default settings (warm-up tasks until every volunteer executor is `trusted`), so in the default
arm only the random 2% share of the volunteers' leases is checked, as in a fleet that has been running.

Fresh fleet (`--fresh-runs`, 0 to skip): afterwards the steady agents are stopped and each arm starts
new agents under new names (new executors, untrusted: in the default arm every lease of theirs is
checked until it has agreed 5 times), waits until they registered (the model load is not timed), then
runs the embedding task once. Both arms pay the first inferences of a new process; the default arm also pays
earning trust.

Extra attempts are the task's subtask_attempts with outcome 'agreed' (a replica that matched) or
'candidate' (a result held for a check not yet decided; none once a task is completed): the
subtasks run twice. Every task must complete; the checked ones must agree (no 'outvoted').
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

import asyncpg  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from bench.machine import cpu_model  # noqa: E402
from bench.scratch import scratch_postgres  # noqa: E402
from minions.config import Settings  # noqa: E402
from minions.db.connect import connect  # noqa: E402
from minions.db.migrate import migrate  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402
from minions.sample import embedding_records  # noqa: E402
from minions.sdk import MinionsClient  # noqa: E402
from minions.testing.agents import AgentFleet, AgentProcess  # noqa: E402
from minions.testing.factories import make_token  # noqa: E402
from minions.testing.processes import Services  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
AGENT_ARGS = ("--threads", "1", "--precision", "fp32", "--model", MODEL)
KINDS = ("embedding", "sleep")
TEAM, PROJECT = "bench", "spot-checks"
def _defaults() -> dict[str, str]:
    """The shipped defaults, written out: Services sets share 0 and trust 0 unless told otherwise."""
    fields = {f.name: f.default for f in dataclasses.fields(Settings)}
    return {"MINIONS_SPOT_CHECK_SHARE": str(fields["spot_check_share"]),
            "MINIONS_TRUST_AGREEMENTS": str(fields["trust_agreements"]),
            "MINIONS_QUARANTINE_AFTER": str(fields["quarantine_after"])}


ARMS: dict[str, dict[str, str]] = {
    "zero": {"MINIONS_SPOT_CHECK_SHARE": "0", "MINIONS_TRUST_AGREEMENTS": "0"},
    "default": _defaults(),
}


@dataclass
class Measure:
    phase: str  # steady | fresh
    arm: str
    workload: str  # embedding | sleep
    records: int
    seconds: float
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    @property
    def extra(self) -> int:
        return self.outcomes.get("agreed", 0) + self.outcomes.get("candidate", 0)


class Bench:
    def __init__(self, args: argparse.Namespace, url: str, workdir: Path, console: Console) -> None:
        self.args, self.url, self.console = args, url, console
        sweep_s = {f.name: f.default for f in dataclasses.fields(Settings)}["sweep_interval_s"]
        self.base_env = {"MINIONS_LOG_LEVEL": "warning", "MINIONS_API_WORKERS": "1",
                         "MINIONS_SWEEP_INTERVAL_S": str(sweep_s)}
        self.services = Services(url, workdir / "services", heartbeat_interval_s=2.0, lease_timeout_s=20.0,
                                 long_poll_s=5.0, extra_env=dict(self.base_env))
        self.arm: str | None = None
        self.conn: asyncpg.Connection | None = None
        self.admin = ""
        self.tokens: list[str] = []
        self.fleets: list[AgentFleet] = []
        self.live: list[AgentProcess] = []
        self.tasks = 0
        self.all_agents: list[AgentProcess] = []

    @property
    def db(self) -> asyncpg.Connection:
        assert self.conn is not None
        return self.conn

    async def open(self) -> None:
        await migrate(self.url)
        self.conn = await connect(self.url)
        self.admin, _ = await make_token(self.conn, "admin")
        # The first token vouched for (as `minions up`'s local agents'), the others volunteers': a
        # volunteer's checked lease goes to the vouched agent's replica, and it earns trust only so.
        self.tokens = [(await make_token(self.conn, "executor", trusted=n == 0))[0] for n in range(self.args.tokens)]
        self.fleets = [AgentFleet(self.services, token) for token in self.tokens]

    async def close(self) -> None:
        await asyncio.to_thread(self.stop_agents)
        await asyncio.to_thread(self.services.stop_all)
        if self.conn is not None:
            await self.conn.close()

    def logs(self) -> str:
        return self.services.logs() + "\n" + "\n".join(
            f"--- agent {a.name} ---\n{a.log()[-3000:]}" for a in self.all_agents)

    async def use_arm(self, arm: str) -> None:
        """The services running with `arm`'s settings (restarted when they run another's)."""
        if self.arm == arm:
            return
        if self.arm is not None:
            await asyncio.to_thread(self.services.stop_all)
        self.services.extra_env = {**self.base_env, **ARMS[arm]}
        await self.services.start_all()
        self.arm = arm
        if self.live:
            await self.reconnected()

    async def start_agents(self, tag: str) -> None:
        names = []
        for n, fleet in enumerate(self.fleets):
            name = f"{tag}-{n}"
            agent = fleet.start(name, *AGENT_ARGS, kinds=KINDS)
            self.live.append(agent)
            self.all_agents.append(agent)
            names.append(name)
        deadline = time.monotonic() + 300
        while await self.db.fetchval("SELECT count(*) FROM executors WHERE name = ANY($1) AND status = 'online'",
                                     names) < len(names):
            for agent in self.live:
                assert agent.process.poll() is None, f"agent {agent.name} exited:\n{agent.log()[-3000:]}"
            assert time.monotonic() < deadline, self.logs()
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # each in its first long poll

    def stop_agents(self) -> None:
        for agent in self.live:
            try:
                agent.terminate(20)
            except subprocess.TimeoutExpired:
                agent.kill()
        self.live = []

    async def stopped(self) -> None:
        """Every stopped agent's executor offline: none is counted as a possible replica."""
        deadline = time.monotonic() + 60
        while await self.db.fetchval("SELECT count(*) FROM executors WHERE status <> 'offline'"):
            assert time.monotonic() < deadline, "stopped agents still listed online"
            await asyncio.sleep(0.2)

    async def reconnected(self) -> None:
        """After a restart: each live agent has completed a lease again (its backoff is over)."""
        names = [a.name for a in self.live]
        back: set[str] = set()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            task_id = await self.run_task(f"ping-{self.tasks}", "sleep",
                                          [{"id": i, "ms": 0} for i in range(4 * len(names))], 1)
            back |= {r["name"] for r in await self.db.fetch(
                """SELECT DISTINCT e.name FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                    WHERE a.task_id = $1 AND e.name = ANY($2)""", task_id, names)}
            if len(back) == len(names):
                await asyncio.sleep(1.0)
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"agents {set(names) - back} not back after the restart:\n{self.logs()}")

    async def run_task(self, name: str, kind: str, records: list[dict[str, Any]], subtask_size: int, *,
                       timeout_s: float = 900) -> int:
        self.tasks += 1
        body: dict[str, Any] = {"team": TEAM, "project": PROJECT, "name": name, "kind": kind,
                                "input": {"records": records}, "subtask_size": subtask_size}
        if kind == "embedding":
            body["model"] = MODEL
        async with MinionsClient(self.services.api_url, self.admin) as client:
            await client.submit(body)
        deadline = time.monotonic() + timeout_s
        while True:
            row = await self.db.fetchrow("SELECT id, status FROM tasks WHERE team = $1 AND project = $2 AND name = $3 "
                                         "AND finished_at IS NOT NULL", TEAM, PROJECT, name)
            if row is not None:
                break
            assert time.monotonic() < deadline, f"task {name} did not finish in {timeout_s} s:\n{self.logs()}"
            await asyncio.sleep(0.05)
        assert row["status"] == "completed", f"task {name} ended {row['status']}:\n{self.logs()}"
        return int(row["id"])

    async def measure(self, phase: str, arm: str, workload: str, index: int) -> Measure:
        if workload == "embedding":
            records: list[dict[str, Any]] = list(embedding_records(self.args.sentences))
            size = self.args.subtask_size
        else:
            records = [{"id": i, "ms": 0} for i in range(self.args.sleep_subtasks)]
            size = 1
        task_id = await self.run_task(f"{phase}-{arm}-{workload}-{index}", workload, records, size)
        seconds = await self.db.fetchval(
            "SELECT extract(epoch FROM finished_at - created_at)::float8 FROM tasks WHERE id = $1", task_id)
        outcomes = {r["outcome"]: int(r["n"]) for r in await self.db.fetch(
            "SELECT outcome, count(*) AS n FROM subtask_attempts WHERE task_id = $1 GROUP BY outcome", task_id)}
        if self.args.timeline:
            for r in await self.db.fetch(
                    """SELECT a.subtask_id, e.name, a.outcome, a.seconds,
                              extract(epoch FROM a.started_at - t.created_at)::float8 AS start,
                              extract(epoch FROM a.ended_at - t.created_at)::float8 AS "end"
                         FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                         JOIN tasks t ON t.id = a.task_id
                        WHERE a.task_id = $1 ORDER BY a.ended_at DESC LIMIT 6""", task_id):
                self.console.print(f"    #{r['subtask_id']} {r['name']} {r['outcome']} {r['start']:.3f} -> "
                                   f"{r['end']:.3f} s (ran {r['seconds'] or 0:.3f} s)")
        assert outcomes.get("outvoted", 0) == 0, f"honest agents disagreed: {outcomes}"
        assert outcomes.get("done", 0) == -(-len(records) // size), outcomes
        return Measure(phase, arm, workload, len(records), float(seconds), outcomes)

    async def _vouched_names(self) -> set[str]:
        rows = await self.db.fetch("SELECT e.name FROM executors e JOIN api_tokens t ON t.id = e.token_id "
                                   "WHERE t.trusted")
        return {r["name"] for r in rows}

    async def earn_trust(self) -> None:
        """Warm-up under the default settings until every live volunteer executor is trusted (a
        vouched one is never checked: it needs no trust of its own)."""
        names = [a.name for a in self.live if a.name not in await self._vouched_names()]
        await self.run_task("warm-embedding", "embedding", list(embedding_records(2 * self.args.subtask_size)),
                            self.args.subtask_size)
        for n in range(20):
            trusted = await self.db.fetchval("SELECT count(*) FROM executors WHERE name = ANY($1) AND trusted",
                                             names)
            if trusted == len(names):
                return
            await self.run_task(f"warm-sleep-{n}", "sleep", [{"id": i, "ms": 0} for i in range(20)], 1)
        raise AssertionError(f"executors {names} never trusted:\n{self.logs()}")


def arm_order(round_no: int) -> list[str]:
    return ["zero", "default"] if round_no % 2 == 0 else ["default", "zero"]


async def run(args: argparse.Namespace, server: EmbeddedPostgres, workdir: Path, console: Console) -> list[Measure]:
    bench = Bench(args, server.url, workdir, console)
    measures: list[Measure] = []
    steps = args.runs * 2 * 2 + args.fresh_runs * 2
    try:
        await bench.open()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            bar = progress.add_task("start + trust", total=steps)
            await bench.use_arm("default")
            await bench.start_agents("steady")
            await bench.earn_trust()
            for round_no in range(args.runs):
                for arm in arm_order(round_no):
                    await bench.use_arm(arm)
                    for workload in ("embedding", "sleep"):
                        progress.update(bar, description=f"steady round {round_no + 1} {arm} {workload}")
                        m = await bench.measure("steady", arm, workload, round_no)
                        measures.append(m)
                        progress.advance(bar)
                        console.print(f"steady round {round_no + 1} {arm:7s} {workload:9s} {m.rate:8.1f} records/s "
                                      f"({m.seconds:.2f} s), attempts {m.outcomes}")
            if args.fresh_runs:
                await asyncio.to_thread(bench.stop_agents)
                await bench.stopped()
            for round_no in range(args.fresh_runs):
                for arm in arm_order(round_no):
                    progress.update(bar, description=f"fresh round {round_no + 1} {arm}: agents start")
                    await bench.use_arm(arm)
                    await bench.start_agents(f"fresh{round_no}-{arm}")
                    progress.update(bar, description=f"fresh round {round_no + 1} {arm} embedding")
                    m = await bench.measure("fresh", arm, "embedding", round_no)
                    measures.append(m)
                    progress.advance(bar)
                    console.print(f"fresh  round {round_no + 1} {arm:7s} embedding {m.rate:8.1f} records/s "
                                  f"({m.seconds:.2f} s), attempts {m.outcomes}")
                    await asyncio.to_thread(bench.stop_agents)
                    await bench.stopped()
    except BaseException:
        console.print(bench.logs()[-8000:], markup=False, highlight=False)
        raise
    finally:
        await bench.close()
    return measures




def report(args: argparse.Namespace, measures: list[Measure], argv: list[str]) -> Iterator[str]:
    yield ""
    yield f"command: python bench/spot_checks.py {' '.join(argv)}".rstrip()
    yield (f"machine: `lscpu` model name {cpu_model()!r}, {os.cpu_count()} CPUs; load average "
           f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    yield (f"agents: {args.tokens} (one per executor token), {' '.join(AGENT_ARGS)}; embedding: {args.sentences} "
           f"sentences in subtasks of {args.subtask_size}; sleep: {args.sleep_subtasks} subtasks of one 0 ms record")
    yield f"default arm: {', '.join(f'{k}={v}' for k, v in ARMS['default'].items())}; zero arm: " + ", ".join(
        f"{k}={v}" for k, v in ARMS["zero"].items())
    yield ""
    yield ("| phase | workload | runs | zero: records/s | default: records/s | default / zero "
           "| extra attempts zero | extra attempts default |")
    yield "|---|---|---:|---:|---:|---:|---|---|"
    for phase in ("steady", "fresh"):
        for workload in ("embedding", "sleep"):
            by = {arm: [m for m in measures if (m.phase, m.workload, m.arm) == (phase, workload, arm)]
                  for arm in ("zero", "default")}
            if not by["zero"] or not by["default"]:
                continue
            rate = {arm: statistics.median(m.rate for m in ms) for arm, ms in by.items()}
            extra = {arm: "/".join(str(m.extra) for m in ms) for arm, ms in by.items()}
            yield (f"| {phase} | {workload} | {len(by['zero'])} | {rate['zero']:.1f} | {rate['default']:.1f} | "
                   f"**{rate['default'] / rate['zero']:.3f}** | {extra['zero']} | {extra['default']} |")
    yield ""
    yield "each run's records/s (zero | default):"
    for phase in ("steady", "fresh"):
        for workload in ("embedding", "sleep"):
            cells = {arm: ", ".join(f"{m.rate:.1f}" for m in measures
                                    if (m.phase, m.workload, m.arm) == (phase, workload, arm))
                     for arm in ("zero", "default")}
            if cells["zero"]:
                yield f"  {phase} {workload}: {cells['zero']} | {cells['default']}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=4, help="steady-state rounds (each: both arms, alternating order)")
    p.add_argument("--fresh-runs", type=int, default=None, help="fresh-fleet rounds (0: none; default 2, --quick 0)")
    p.add_argument("--tokens", type=int, default=2, help="executor tokens, one agent each (at least 2)")
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--subtask-size", type=int, default=50)
    p.add_argument("--sleep-subtasks", type=int, default=400)
    p.add_argument("--timeline", action="store_true", help="print each task's last attempts (its tail)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 1 round, no fresh fleet (unless --fresh-runs), 100 sentences, 40 sleep subtasks")
    args = p.parse_args(argv)
    if args.quick:
        args.runs, args.sentences, args.sleep_subtasks = 1, 100, 40
    if args.fresh_runs is None:
        args.fresh_runs = 0 if args.quick else 2
    if args.tokens < 2:
        p.error("--tokens must be at least 2: a lease is checked only when another executor could replicate it")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    console = Console(soft_wrap=True)
    with scratch_postgres("minions-bench-spot-") as (server, root):
        measures = asyncio.run(run(args, server, root, console))
    for line in report(args, measures, argv):
        print(line)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
