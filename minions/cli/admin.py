"""Operator commands: db migrate, token create / list / revoke, psql."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from minions import cluster_settings, config
from minions.cli import tokens
from minions.cli.connection import database_url
from minions.cli.gateway import connected
from minions.db.migrate import migrate
from minions.embedded_pg import bin_path
from minions.names import is_name
from minions.tokens import TOKEN_ROLES, hash_token, new_token, token_prefix


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = sub.add_parser("db", help="database operations")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    p = db_sub.add_parser("migrate", help="apply the schema in sql/ (idempotent); MINIONS_LEASE_TIMEOUT_S / "
                                          "MINIONS_MAX_ATTEMPTS, if given, set the cluster's values")
    config.add_arguments(p, config.names_for(config.MIGRATE))
    p.add_argument("--data-dir", default=None, help="use the database of a `minions up` data dir")
    p.set_defaults(handler=db_migrate)

    token = sub.add_parser("token", help="API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    p = token_sub.add_parser("create", help="create a token and print it (it is stored only hashed)")
    config.add_arguments(p, ("database_url",))
    p.add_argument("--data-dir", default=None, help="use the database of a `minions up` data dir")
    p.add_argument("--role", required=True, choices=TOKEN_ROLES, help="what the token may do (required)")
    p.add_argument("--team", default=None, help="scope the token to one team")
    p.add_argument("--label", default="", help="a note saying who or what holds it")
    p.add_argument("--expires-in", type=tokens.duration_s, default=None, metavar="DURATION",
                   help="the token stops working after this long: 3600, 90m, 12h, 30d, 2w (default: never)")
    p.add_argument("--owner", default=None, metavar="WHO",
                   help="the person or organisation it is issued to: spot checks count owners, so one owner's "
                        "machines never check each other (default: the token is its own owner)")
    p.add_argument("--trusted", action="store_true",
                   help="an executor token whose machines you vouch for: their results commit without a check "
                        "and settle volunteers' checks (default: a volunteer's)")
    p.set_defaults(handler=token_create)
    tokens.add_parsers(token_sub)

    p = sub.add_parser("psql", help="open psql on the database (of `minions up`, or MINIONS_DATABASE_URL)")
    config.add_arguments(p, ("database_url",))
    p.add_argument("--data-dir", default=None, help="use the database of a `minions up` data dir")
    p.add_argument("psql_args", nargs=argparse.REMAINDER, help="anything else goes to psql as is, e.g. -c \"SELECT 1\"")
    p.set_defaults(handler=psql)


def db_migrate(args: argparse.Namespace) -> int:
    url = database_url(args)
    applied = asyncio.run(migrate(url))
    print(f"applied {len(applied)} migration(s): {', '.join(applied)}" if applied else "schema is up to date")
    for key, value in asyncio.run(cluster_settings.apply_given_at(url, config.from_args(args))).items():
        print(f"cluster setting: {key} = {value}")
    return 0


async def create_token(url: str, role: str, team: str | None, label: str, token: str | None = None,
                       expires_in_s: float | None = None, owner: str | None = None, trusted: bool = False) -> str:
    token = token or new_token()
    async with connected(url) as db:
        await db.insert_token(token_hash=hash_token(token), prefix=token_prefix(token), role=role, team=team,
                              label=label, expires_in_s=expires_in_s, owner=owner, trusted=trusted)
    return token


def token_create(args: argparse.Namespace) -> int:
    if args.team is not None and not is_name(args.team):
        raise SystemExit(f"minions: {args.team!r} is not a valid team name")
    if args.trusted and args.role != "executor":
        raise SystemExit("minions: --trusted is for executor tokens (machines an admin vouches for)")
    if args.owner is not None and (not 1 <= len(args.owner) <= 200 or args.owner.startswith("token:")
                                   or "\x00" in args.owner):
        raise SystemExit("minions: --owner must be 1-200 characters, not starting with 'token:'")
    print(asyncio.run(create_token(database_url(args), args.role, args.team, args.label,
                                   expires_in_s=args.expires_in, owner=args.owner, trusted=args.trusted)))
    return 0


def psql(args: argparse.Namespace) -> int:
    url = database_url(args)
    exe = str(bin_path("psql"))
    sys.stdout.flush()
    os.execv(exe, [exe, url, *args.psql_args])
