"""Where PostgreSQL's time goes, per subtask: pg_stat_statements on a bench's scratch server
(`bench/drain.py --statements N`).

Every statement is counted, those that functions run inside them too (track = all), with its
planning (track_planning): a statement planned again at every call shows as one plan per call, and
a statement that reads more and more of an index as a queue drains shows its buffers growing. The
counting costs time itself: the rates of a run with it are not the figures of the tables.
"""

from __future__ import annotations

import asyncpg

from bench.scratch import admin
from minions.embedded_pg import EmbeddedPostgres

TOP = """
SELECT toplevel, calls, total_exec_time, total_plan_time, plans, shared_blks_hit + shared_blks_read AS blocks,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 96) AS query
  FROM pg_stat_statements
 WHERE calls > 0
 ORDER BY total_exec_time + total_plan_time DESC
 LIMIT $1
"""


async def enable(server: EmbeddedPostgres, track: str = "all") -> None:
    """Preloads pg_stat_statements (the server restarts) and creates its view in the server's own
    database, where `reset` and `report` read the whole cluster's counts. `track`: 'all' counts the
    statements functions run too, 'top' only those clients send (round trips, bench/costs.py)."""
    await admin(server.url, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'",
                f"ALTER SYSTEM SET pg_stat_statements.track = '{track}'",
                "ALTER SYSTEM SET pg_stat_statements.track_planning = on")
    server.stop()
    server.start()
    await admin(server.url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


async def reset(server: EmbeddedPostgres) -> None:
    await admin(server.url, "SELECT pg_stat_statements_reset()")


async def report(server: EmbeddedPostgres, label: str, subtasks: int, top: int) -> str:
    """The `top` statements by time since the last reset, per subtask: calls, execution (functions'
    inner statements included in their caller's), planning, plans per call, buffers per call. T marks
    a statement a client sent; the others ran inside a function."""
    conn = await asyncpg.connect(server.url)
    try:
        rows = await conn.fetch(TOP, top)
        total = await conn.fetchrow(
            "SELECT sum(total_exec_time) FILTER (WHERE toplevel) AS exec, sum(total_plan_time) AS plan "
            "FROM pg_stat_statements")
    finally:
        await conn.close()
    # Two totals that must not be added: a function's inner statements are planned while their
    # caller executes, so their planning is inside the callers' execution too.
    lines = [f"# {label}: per subtask ({subtasks} subtasks): execution of the statements clients sent "
             f"{(total['exec'] or 0) / subtasks:.3f} ms (their inner statements' planning included); "
             f"planning of every statement {(total['plan'] or 0) / subtasks:.3f} ms",
             "#   calls  exec us  plan us  plans/call  blocks/call  statement"]
    for r in rows:
        calls = r["calls"]
        lines.append(
            f"# {'T' if r['toplevel'] else ' '} {calls / subtasks:6.2f} {r['total_exec_time'] / subtasks * 1000:8.1f} "
            f"{r['total_plan_time'] / subtasks * 1000:8.1f} {r['plans'] / calls:11.2f} {r['blocks'] / calls:12.1f}  "
            f"{r['query']}")
    return "\n".join(lines)
