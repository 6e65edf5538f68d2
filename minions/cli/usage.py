"""`minions usage`: the compute each team used and each executor (or owner) gave, through the API
(GET /api/v1/usage), as a table or one JSON document."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from minions import jsoncodec
from minions.cli import connection
from minions.cli.client_command import client_command
from minions.cli.tasks import print_table
from minions.cli.times import shown_time
from minions.usage import DEFAULT_SINCE, SINCE_RULE, USAGE_BY, since_s

# The columns naming a row, by grouping; the counts follow.
KEYS = {"team": [("TEAM", "team")], "executor": [("EXECUTOR", "executor"), ("OWNER", "owner")],
        "owner": [("OWNER", "owner")]}


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "usage", help="compute used per team, given per executor or owner",
        description="Compute-seconds of the attempts that ended in the window: used (a team's own work), "
                    "verification (its spot checks' replicas and outvoted results, charged to it too) and "
                    "lost (nobody's: lost, released and revoked attempts); records of the used ones. A team's "
                    "token sees its team only.")
    connection.add_arguments(p)
    p.add_argument("--since", default=DEFAULT_SINCE, help="how far back: 90m, 12h, 7d, 2w")
    p.add_argument("--team", help="only this team's usage (default: your token's team, or every team)")
    p.add_argument("--by", choices=USAGE_BY, default="team", help="one row per team, executor or owner")
    p.set_defaults(handler=client_command(usage))


def compute(seconds: float) -> str:
    """Compute-seconds as a person reads them: 42.0s, 12m 05s, 3h 07m, 2d 04h."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"


def _line(keys: list[str], counts: dict[str, Any]) -> list[str]:
    return [*keys, compute(counts["used_s"]), compute(counts["verification_s"]), compute(counts["lost_s"]),
            f"{counts['records']:,}", f"{counts['attempts']:,}"]


async def usage(args: argparse.Namespace) -> int:
    if since_s(args.since) is None:  # refused here, before any request
        print(f"minions: --since {args.since!r}: {SINCE_RULE}", file=sys.stderr)
        return 2
    async with connection.client_from_args(args) as client:
        report = await client.usage(since=args.since, team=args.team, by=args.by)
    if args.json:
        print(jsoncodec.dumps_str(report))
        return 0
    scope = f"team {report['team']}" if report["team"] else "every team"
    print(f"usage of {scope} since {shown_time(report['since'])}, by {report['by']}")
    if not report["usage"]:
        print("no attempts ended in this window")
        return 0
    keys = KEYS[report["by"]]
    rows = [_line([row[field] or "-" for _, field in keys], row) for row in report["usage"]]
    total = _line(["TOTAL", *[""] * (len(keys) - 1)], report["totals"])
    print_table([header for header, _ in keys] + ["USED", "VERIFICATION", "LOST", "RECORDS", "ATTEMPTS"],
                [*rows, total])
    return 0
