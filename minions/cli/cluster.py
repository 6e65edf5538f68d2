"""`minions settings show|set`: the cluster-wide values (minions/cluster_settings.py), read and
written in the database, where every service and SQL function reads them.

    minions settings show
    minions settings set lease_timeout_s 60
    minions settings set max_attempts 5

A change reaches running services at once (NOTIFY minion_settings); no restart is needed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from minions import cluster_settings, config, jsoncodec
from minions.cli.connection import database_url
from minions.db.connect import connect


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    settings = sub.add_parser("settings", help="cluster-wide settings kept in the database")
    settings_sub = settings.add_subparsers(dest="settings_command", required=True)
    p = settings_sub.add_parser("show", help="the cluster-wide settings")
    _database_flags(p)
    p.add_argument("--json", action="store_true", help="machine-readable JSON output (one document)")
    p.set_defaults(handler=show)
    p = settings_sub.add_parser("set", help="set one cluster-wide setting (running services follow at once)")
    _database_flags(p)
    p.add_argument("key", choices=cluster_settings.KEYS, help="the setting")
    p.add_argument("value", help="its new value")
    p.set_defaults(handler=set_)


def _database_flags(p: argparse.ArgumentParser) -> None:
    config.add_arguments(p, ("database_url", "heartbeat_interval_s"))
    p.add_argument("--data-dir", default=None, help="use the database of a `minions up` data dir")


def show(args: argparse.Namespace) -> int:
    current = asyncio.run(_with_connection(database_url(args), cluster_settings.read))
    values = {"lease_timeout_s": current.lease_timeout_s, "max_attempts": current.max_attempts}
    if args.json:
        sys.stdout.write(jsoncodec.dumps(values).decode() + "\n")
    else:
        for key, value in values.items():
            print(f"{key} = {value:g}")
    return 0


def set_(args: argparse.Namespace) -> int:
    if args.key == "lease_timeout_s":
        # The one check SQL cannot make: the heartbeat interval is the API's (env/flag), not the database's.
        try:
            check = float(args.value)
        except ValueError:
            raise SystemExit(f"minions settings: lease_timeout_s must be seconds, not {args.value!r}") from None
        try:
            config.check_lease_timeout(check, config.from_args(args).heartbeat_interval_s)
        except config.ConfigError as exc:
            raise SystemExit(f"minions settings: {exc}") from None

    async def store(conn: asyncpg.Connection) -> str:
        return await cluster_settings.set_value(conn, args.key, args.value)

    try:
        stored = asyncio.run(_with_connection(database_url(args), store))
    except asyncpg.CheckViolationError as exc:
        raise SystemExit(f"minions settings: {exc}") from None
    print(f"{args.key} = {stored}")
    return 0


T = TypeVar("T")


async def _with_connection(url: str, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    conn = await connect(url)
    try:
        return await work(conn)
    finally:
        await conn.close()
