"""Operator commands for stored data: `minions gc` (garbage collection of the object store) and
`minions team allow-input|disallow-input|inputs` (which S3 prefixes a team's tasks may read); the
`minions team` commands of teams' shares of the pool are minions/cli/team_shares.py's."""

from __future__ import annotations

import argparse
import asyncio
import sys

import asyncpg

from minions import config, retention
from minions.cli import connection
from minions.cli.client_command import client_command
from minions.cli.connection import database_url
from minions.cli.gateway import InputPrefixRow, connected
from minions.cli.team_shares import add_team_parsers
from minions.cli.times import shown_time
from minions.db.connect import connect
from minions.names import is_name
from minions.store.factory import open_store
from minions.store_gc import GcReport, collect_garbage


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("gc", help="delete garbage from the object store: unreferenced uploads, "
                                  "outputs of deleted tasks and lost attempts, partial writes")
    config.add_arguments(p, ("database_url", "store", "s3_endpoint_url", "gc_grace_s", "retention_days"))
    p.add_argument("--data-dir", default=None, help="use the database and store of a `minions up` data dir")
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    p.add_argument("--retention", action="store_true",
                   help="instead: run the retention job now (delete finished tasks older than "
                        "--retention-days with their subtasks and history)")
    p.add_argument("--batch", type=int, default=retention.BATCH, help="subtasks per transaction (--retention)")
    p.set_defaults(handler=gc)

    p = sub.add_parser("delete", help="delete a finished task (its input and results are then garbage)")
    connection.add_arguments(p)
    p.add_argument("task", help="TEAM/PROJECT/NAME")
    p.set_defaults(handler=client_command(delete))

    team = sub.add_parser("team", help="team settings: shares of the pool (shares, set-weight, set-priority-cap, "
                                       "set-max-leases), allowed inputs (allow-input, inputs)")
    team_sub = team.add_subparsers(dest="team_command", required=True)
    for name, handler, text in (
        ("allow-input", allow_input, "let TEAM's tasks read inputs under an s3:// prefix"),
        ("disallow-input", disallow_input, "withdraw an allowed s3:// prefix (submitted tasks keep theirs)"),
    ):
        p = team_sub.add_parser(name, help=text)
        config.add_arguments(p, ("database_url",))
        p.add_argument("--data-dir", default=None, help="use the database of a `minions up` data dir")
        p.add_argument("team", help="the team's name")
        p.add_argument("prefix", help="s3://bucket/prefix")
        p.set_defaults(handler=handler)
    p = team_sub.add_parser("inputs", help="TEAM's allowed s3:// prefixes and stored input bytes")
    config.add_arguments(p, ("database_url", "team_input_quota_bytes"))
    p.add_argument("--data-dir", default=None, help="use the database of a `minions up` data dir")
    p.add_argument("team", help="the team's name")
    p.set_defaults(handler=team_inputs)
    add_team_parsers(team_sub)


def _store_uri(args: argparse.Namespace) -> str:
    return connection.server_setting(config.from_args(args).store, args.data_dir, "store",
                                     "pass --store or set MINIONS_STORE")


def _print_progress(phase: str, report: GcReport) -> None:
    line = f"gc [{phase}] {report.summary()}"
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[2K" + line + ("\n" if phase == "done" else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _print_retention(report: retention.RetentionReport) -> None:
    sys.stderr.write(f"retention: {report.summary()}\n")
    sys.stderr.flush()


def run_retention(args: argparse.Namespace) -> int:
    days = config.from_args(args).retention_days
    if days <= 0:
        raise SystemExit("minions: the retention job is off (MINIONS_RETENTION_DAYS=0); pass --retention-days")
    if args.batch < 1 or args.dry_run:
        raise SystemExit("minions: --retention needs --batch >= 1 and has no --dry-run")

    async def run() -> retention.RetentionReport:
        conn = await connect(database_url(args))
        try:
            return await retention.run_retention(conn, days, batch=args.batch, progress=_print_retention)
        finally:
            await conn.close()

    report = asyncio.run(run())
    if report.ran:
        print(report.summary() + "; their objects go at the next `minions gc`")
        return 0
    print(f"minions: {report.summary()}", file=sys.stderr)
    return 1


def gc(args: argparse.Namespace) -> int:
    if args.retention:
        return run_retention(args)
    settings = config.from_args(args)
    url, store_uri = database_url(args), _store_uri(args)

    async def run() -> GcReport:
        conn = await connect(url)
        try:
            store = open_store(store_uri, s3_endpoint_url=settings.s3_endpoint_url)
            try:
                return await collect_garbage(conn, store, grace_s=settings.gc_grace_s, dry_run=args.dry_run,
                                             progress=_print_progress)
            finally:
                await store.close()
        finally:
            await conn.close()

    report = asyncio.run(run())
    print(("dry run: " if args.dry_run else "") + report.summary())
    return 1 if report.errors else 0


async def delete(args: argparse.Namespace) -> int:
    """A client command (over the API: `client_command` runs it and reports its errors)."""
    parts = args.task.split("/")
    if len(parts) != 3 or not all(parts):
        raise SystemExit(f"minions: expected TEAM/PROJECT/NAME, got {args.task!r}")
    async with connection.client_from_args(args) as client:
        await client.delete(*parts)
    print(f"deleted {args.task}; its stored input and results go at the next garbage collection")
    return 0


def _team(value: str) -> str:
    if not is_name(value):
        raise SystemExit(f"minions: {value!r} is not a valid team name")
    return value


async def _allow_input(url: str, team: str, prefix: str) -> bool:
    async with connected(url) as db:
        return await db.allow_input(team=team, prefix=prefix)


async def _disallow_input(url: str, team: str, prefix: str) -> bool:
    async with connected(url) as db:
        return await db.disallow_input(team=team, prefix=prefix)


def allow_input(args: argparse.Namespace) -> int:
    team = _team(args.team)
    try:
        added = asyncio.run(_allow_input(database_url(args), team, args.prefix))
    except asyncpg.CheckViolationError:
        raise SystemExit(f"minions: {args.prefix!r} is not an s3://bucket/prefix") from None
    print(f"team {team} may read {args.prefix}" + ("" if added else " (it already could)"))
    return 0


def disallow_input(args: argparse.Namespace) -> int:
    team = _team(args.team)
    removed = asyncio.run(_disallow_input(database_url(args), team, args.prefix))
    print(f"team {team} may no longer read {args.prefix}" if removed else
          f"minions: {args.prefix} was not allowed for team {team}")
    return 0 if removed else 1


def team_inputs(args: argparse.Namespace) -> int:
    team = _team(args.team)
    quota = config.from_args(args).team_input_quota_bytes

    async def run() -> tuple[list[InputPrefixRow], int]:
        async with connected(database_url(args)) as db:
            return await db.input_prefixes(team=team), await db.team_input_bytes(team=team)

    prefixes, used = asyncio.run(run())
    print(f"team {team} stores {used:,} bytes of input" + (f" of its {quota:,}-byte quota" if quota else ""))
    for row in prefixes:
        print(f"may read {row['prefix']} (since {shown_time(row['created_at'])})")
    if not prefixes:
        print("no s3:// prefixes allowed (its tasks read only its own uploads)")
    return 0
