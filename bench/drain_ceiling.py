"""How far the direct-SQL drain could go on this machine if the per-subtask path kept fewer of the
schema's invariants: the sql-new arm of bench/drain.py (`--clients` connections looping minion_claim +
minion_complete over one task of one-record subtasks) on scratch databases whose functions and
constraints lose one invariant after another, beside sql-baseline, alternating, medians of the runs:

    python bench/drain_ceiling.py [--subtasks 6000] [--clients 16] [--runs 3]

Each variant keeps what the one before it dropped, and drops:
  -referee      the referee row: minion_claim_in no longer inserts into minion_subtask_acquirement (the
                unique row by which no two leases of one subtask can both be won), and
                minion_drop_referee_row does nothing
  -attempts     the attempt history: minion_complete no longer writes its 'done' row to subtask_attempts
  -fks          the foreign keys of subtasks, subtask_attempts and minion_subtask_acquirement
  -checks       the CHECK constraints of subtasks (state, lease and result consistency)
  -progress     task progress: minion_subtask_closed does nothing (no slot counts, no settle probe)

The variants exist only in their scratch database, for this measurement: they answer what the target
"direct SQL >= 2x the functions as shipped" would cost in invariants, not a change to make. A variant
that dropped the attempt history or the progress is checked for every subtask completed once, not for
the end state bench/drain.py checks (what it reads is gone).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")

from bench.drain import prepare_template, scratch, sql_arm  # noqa: E402
from bench.scratch import admin, scratch_postgres  # noqa: E402
from minions import runtime  # noqa: E402
from minions.embedded_pg import EmbeddedPostgres  # noqa: E402

Step = Callable[[asyncpg.Connection], Awaitable[None]]


async def _without(conn: asyncpg.Connection, function: str, start: str, end: str, *, last: bool = False) -> None:
    """Replaces `function` by its own text less the lines from `start` (its `last` occurrence, or the
    first) up to `end` (kept)."""
    text = await conn.fetchval("SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.proname = $1", function)
    i = text.rfind(start) if last else text.find(start)
    j = text.find(end, i + 1)
    if i < 0 or j < 0:
        raise SystemExit(f"{function} no longer reads as this bench expects ({start.strip()!r} ... "
                         f"{end.strip()!r}): update bench/drain_ceiling.py")
    await conn.execute(text[:i] + text[j:])


async def drop_referee(conn: asyncpg.Connection) -> None:
    await _without(conn, "minion_claim_in", "    INSERT INTO minion_subtask_acquirement", "    UPDATE subtasks")
    await conn.execute("CREATE OR REPLACE FUNCTION minion_drop_referee_row(p_token uuid) RETURNS void "
                       "LANGUAGE sql AS 'SELECT'")


async def drop_attempts(conn: asyncpg.Connection) -> None:
    # The last insert into subtask_attempts is the winner's 'done' row (those before: a superseded lease).
    await _without(conn, "minion_complete", "    INSERT INTO subtask_attempts", "    PERFORM minion_subtask_closed",
                   last=True)


async def _drop_constraints(conn: asyncpg.Connection, kind: str, tables: tuple[str, ...]) -> None:
    for table, name in await conn.fetch(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint "
            "WHERE contype::text = $1 AND conrelid = ANY ($2::regclass[])", kind, list(tables)):
        await conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')


async def drop_fks(conn: asyncpg.Connection) -> None:
    await _drop_constraints(conn, "f", ("subtasks", "subtask_attempts", "minion_subtask_acquirement"))


async def drop_checks(conn: asyncpg.Connection) -> None:
    await _drop_constraints(conn, "c", ("subtasks",))


async def drop_progress(conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE OR REPLACE FUNCTION minion_subtask_closed(p_task_id bigint, p_failed boolean, "
                       "p_error text DEFAULT NULL, p_records integer DEFAULT 0) RETURNS void LANGUAGE sql AS 'SELECT'")


# What bench/drain.py's end check reads (one attempt row each, the task settled): a variant without
# either is checked for its count of completes only.
DROPS_WHAT_END_CHECK_READS = frozenset({drop_attempts, drop_progress})

STEPS: tuple[tuple[str, Step], ...] = (("-referee", drop_referee), ("-attempts", drop_attempts), ("-fks", drop_fks),
                                       ("-checks", drop_checks), ("-progress", drop_progress))


def variants() -> dict[str, tuple[Step, ...]]:
    """Each variant's steps: sql-new none, then one more step each."""
    out: dict[str, tuple[Step, ...]] = {"sql-new": ()}
    names, steps = "sql-new", tuple[Step, ...]()
    for name, step in STEPS:
        names, steps = names + name, (*steps, step)
        out[names] = steps
    return out


async def run_all(server: EmbeddedPostgres, args: argparse.Namespace) -> dict[str, list[float]]:
    await prepare_template(server)
    arms: dict[str, tuple[Step, ...] | None] = {"sql-baseline": None, **variants()}
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    for run in range(args.runs):
        for arm, steps in arms.items():

            async def prepare(conn: asyncpg.Connection, steps: tuple[Step, ...] = steps or ()) -> None:
                for step in steps:
                    await step(conn)

            name, url = await scratch(server)
            try:
                rate = await sql_arm(url, args.subtasks, args.clients, baseline=steps is None, prepare=prepare,
                                     check_end=not DROPS_WHAT_END_CHECK_READS.intersection(steps or ()))
            finally:
                await admin(server.url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            rates[arm].append(rate)
            print(f"run {run + 1} {arm:45s} {rate:7.0f} /s", flush=True)
    return rates


def table(rates: dict[str, list[float]]) -> str:
    base = statistics.median(rates["sql-baseline"])
    lines = ["| arm | per s (median) | runs | ratio |", "|---|---:|---|---|"]
    for arm, values in rates.items():
        m = statistics.median(values)
        lines.append(f"| {arm} | {m:,.0f} | {', '.join(f'{x:.0f}' for x in values)} | {m / base:.2f}x sql-baseline |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--subtasks", type=int, default=6000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    with scratch_postgres("minions-bench-ceiling-") as (server, _root):
        print(f"# drain ceiling: nproc={len(os.sched_getaffinity(0))}; {args.subtasks} one-record "
              f"subtasks, {args.clients} clients, {args.runs} runs alternating, fsync on")
        rates = runtime.run(run_all(server, args))
    print()
    print(table(rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
