"""`minions compact`: compact completed tasks' results into large parts now (the watchdog does it on
its own every MINIONS_COMPACT_INTERVAL_S). Safe to interrupt and to run beside the watchdog: a
compaction resumes after its recorded parts, and one task is compacted by one process at a time."""

from __future__ import annotations

import argparse
import asyncio
import sys

from minions import config
from minions.cli import connection
from minions.result_parts import Compaction, Compactor, compact_completed
from minions.store_gc import connected_store


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("compact", help="compact completed tasks' results into large parts now")
    config.add_arguments(p, ("database_url", "store", "s3_endpoint_url", "result_part_bytes"))
    p.add_argument("--data-dir", default=None, help="use the database and store of a `minions up` data dir")
    p.add_argument("--task-id", type=int, default=None, help="only this task (its numeric id)")
    p.add_argument("--limit", type=int, default=100, help="at most this many tasks")
    p.set_defaults(handler=compact)


def _progress(report: Compaction) -> None:
    sys.stderr.write(f"compact task {report.task_id}: {report.parts} parts, {report.subtasks:,} subtasks, "
                     f"{report.bytes:,} bytes\n")
    sys.stderr.flush()


def compact(args: argparse.Namespace) -> int:
    settings = config.from_args(args)
    url = connection.database_url(args)
    store_uri = connection.server_setting(settings.store, args.data_dir, "store", "pass --store or set MINIONS_STORE")

    async def run() -> list[Compaction]:
        async with connected_store(url, store_uri, settings.s3_endpoint_url) as (conn, store):
            if args.task_id is not None:
                compactor = Compactor(conn, store, part_bytes=settings.result_part_bytes, progress=_progress)
                return [await compactor.compact(args.task_id)]
            return await compact_completed(conn, store, part_bytes=settings.result_part_bytes,
                                           limit=args.limit, progress=_progress)

    reports = asyncio.run(run())
    for report in reports:
        print(f"task {report.task_id}: " + ("compacted" if report.done else "not compacted (busy or not completed)")
              + f", {report.parts} parts written now ({report.bytes:,} bytes)")
    return 0 if all(r.done for r in reports) else 1
