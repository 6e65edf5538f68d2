"""`minions team set-weight|set-priority-cap|set-max-leases|shares`: teams' shares of the common pool,
through the API like the other client commands (setting one needs an admin token). A bad number is
refused here, by the rule the API applies (minions/team_shares.py), before any request."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from minions import jsoncodec
from minions.cli import connection
from minions.cli.client_command import client_command
from minions.cli.tasks import print_table
from minions.cli.times import shown_time
from minions.names import is_name
from minions.team_shares import RULES, share_problem

INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() also takes other scripts' digits and "1_0"


def _share_value(field: str, parse: Callable[[str], float | int | None]) -> Callable[[str], float | int]:
    """An argparse type: the text as `field`'s value, or an error naming the rule it breaks."""

    def value(text: str) -> float | int:
        parsed = parse(text)
        if (problem := share_problem(field, parsed)) is not None:
            raise argparse.ArgumentTypeError(f"{text!r}: {field.replace('_', ' ')} must be {problem}")
        assert parsed is not None
        return parsed

    return value


def _number(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _integer(text: str) -> int | None:
    return int(text) if INTEGER.fullmatch(text.strip()) else None


def _team(text: str) -> str:
    if not is_name(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a valid team name")
    return text


SETTERS = (
    ("set-weight", "weight", _number, "W", "set TEAM's weight: its share of claims when several teams have work "
                                          "(default 1; 3 beside a team of 1 gets 75%%) (admin)"),
    ("set-priority-cap", "priority_cap", _integer, "N", "set the highest priority TEAM's users may give a task "
                                                        "(default 0; -1000..1000) (admin)"),
    ("set-max-leases", "max_leases", _integer, "N", "cap the leases TEAM may hold at once (0: no cap, the "
                                                    "default) (admin)"),
)


def add_team_parsers(team_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The share commands, under `minions team` (minions/cli/storage.py makes that command)."""
    for name, field, parse, metavar, text in SETTERS:
        p = team_sub.add_parser(name, help=text)
        connection.add_arguments(p)
        p.add_argument("team", type=_team, help="the team's name (one a token, task or executor names)")
        p.add_argument("value", metavar=metavar, type=_share_value(field, parse), help=RULES[field])
        p.set_defaults(handler=client_command(set_share), share_field=field)
    p = team_sub.add_parser("shares", help="each team's weight, priority cap and lease cap, as a table")
    connection.add_arguments(p)
    p.set_defaults(handler=client_command(shares))


def _row(share: dict[str, Any]) -> list[str]:
    return [share["team"], f"{share['weight']:g}", str(share["priority_cap"]),
            str(share["max_leases"]) if share["max_leases"] else "no cap",
            shown_time(share["updated_at"], "default")]


async def set_share(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        share = await client.set_team_share(args.team, **{args.share_field: args.value})
    if args.json:
        print(jsoncodec.dumps_str(share))
    else:
        print(f"team {share['team']}: weight {share['weight']:g}, priority cap {share['priority_cap']}, "
              f"max leases {share['max_leases'] or 'no cap'}")
    return 0


async def shares(args: argparse.Namespace) -> int:
    async with connection.client_from_args(args) as client:
        teams = await client.team_shares()
    if args.json:
        print(jsoncodec.dumps_str({"teams": teams}))
        return 0
    if not teams:
        print("no teams yet: a token, task or executor names one")
        return 0
    print_table(["TEAM", "WEIGHT", "PRIORITY CAP", "MAX LEASES", "SET"], [_row(t) for t in teams])
    return 0
