"""`minions token list` and `minions token revoke`, on the database like `token create` (they work
with the API down, and recover from a lost admin token). The API's /api/v1/tokens runs the same SQL
functions (sql/schema/09_tokens.sql). A list never shows a secret: its id and prefix only."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from typing import Any

from minions import jsoncodec
from minions.cli.connection import add_database_arguments, database_url
from minions.cli.gateway import connected
from minions.cli.times import shown_time
from minions.durations import DURATION_EXAMPLES
from minions.durations import duration_s as parsed_duration_s

MAX_EXPIRES_IN_S = 10 * 365 * 86400.0


def duration_s(text: str) -> float:
    """`90`, `90s`, `15m`, `12h`, `30d`, `2w` as seconds (argparse type)."""
    seconds = parsed_duration_s(text) or 0.0
    if not 0 < seconds <= MAX_EXPIRES_IN_S:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as {DURATION_EXAMPLES} "
                                         "(above 0, at most 10 years)")
    return seconds


def add_parsers(token_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = token_sub.add_parser("list", help="list tokens: id, prefix, role, team, status, trust, owner, label "
                                          "(never a secret)")
    add_database_arguments(p)
    p.add_argument("--status", choices=("active", "expired", "revoked"), default=None, help="only these")
    p.add_argument("--json", action="store_true", help="machine-readable JSON output")
    p.set_defaults(handler=token_list)

    p = token_sub.add_parser("revoke", help="revoke tokens by id (every API process stops taking them at once)")
    add_database_arguments(p)
    p.add_argument("ids", nargs="+", type=int, metavar="ID", help="token id, as `minions token list` shows it")
    p.set_defaults(handler=token_revoke)


async def list_tokens(url: str, status: str | None) -> list[dict[str, Any]]:
    async with connected(url) as db:
        rows = await db.list_tokens(status=status)
    return [dict(r) for r in rows]


async def revoke_tokens(url: str, ids: list[int]) -> dict[int, dt.datetime | None]:
    """Each id's revocation time, or None for an id that names no token."""
    async with connected(url) as db:
        return {token_id: await db.revoke_token(token_id=token_id) for token_id in ids}


def _when(value: Any) -> str:
    return shown_time(value)


def token_list(args: argparse.Namespace) -> int:
    rows = asyncio.run(list_tokens(database_url(args), args.status))
    if args.json:
        print(jsoncodec.dumps_str([{k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in r.items()}
                                   for r in rows]))
        return 0
    header = ("ID", "PREFIX", "ROLE", "TEAM", "STATUS", "TRUST", "OWNER", "CREATED", "EXPIRES", "LABEL")
    table = [header] + [
        (str(r["id"]), (r["prefix"] + "…") if r["prefix"] else "-", r["role"], r["team"] or "(all)", r["status"],
         "trusted" if r["trusted"] else ("volunteer" if r["role"] == "executor" else "-"), r["owner"],
         _when(r["created_at"]), _when(r["expires_at"]), r["label"])
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


def token_revoke(args: argparse.Namespace) -> int:
    revoked = asyncio.run(revoke_tokens(database_url(args), args.ids))
    missing = [token_id for token_id, at in revoked.items() if at is None]
    for token_id, at in revoked.items():
        if at is not None:
            print(f"token {token_id}: revoked ({at.isoformat()})")
    if missing:
        print(f"minions: no token with id {', '.join(map(str, missing))}", file=sys.stderr)
        return 1
    return 0
