"""Where commands connect: flags, then MINIONS_API_URL / MINIONS_TOKEN, then the up.json a local
`minions up` wrote (minions/up_json.py), the lookup the SDK makes too (`client_settings`), so
`minions status` just works on the same machine, from any folder. Operator commands that work on the
database itself find it the same way: --database-url or MINIONS_DATABASE_URL, else the up.json.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from minions import config
from minions.sdk import ApiUnreachable, MinionsClient
from minions.sdk.client import client_settings
from minions.up_json import read_up_json, state_dir


def add_arguments(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    parser.add_argument("--api-url", default=None,
                        help="API URL (default: env MINIONS_API_URL, else up.json, else http://127.0.0.1:8080)")
    parser.add_argument("--token", default=None, help="bearer token (default: env MINIONS_TOKEN, else up.json)")
    parser.add_argument("--data-dir", default=None, type=Path,
                        help="the data dir of a `minions up` whose up.json to use (default: ./.minions if it "
                             f"has one, else {state_dir() / 'up.json'})")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="machine-readable JSON output (one document)")


def server_setting(given: str, data_dir: str | None, key: str, how: str) -> str:
    """A server-side setting of an operator command (the database, the store): the flag or variable
    if `given`, else what the `minions up` of `data_dir` (or of here) wrote; `how` says how to give it."""
    value = given or read_up_json(None if data_dir is None else Path(data_dir)).get(key, "")
    if not value:
        raise SystemExit(f"minions: no {key.replace('_', ' ')}: {how}, or run `minions up` here first")
    return value


def add_database_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of an operator command on the database: --database-url and --data-dir."""
    config.add_arguments(parser, ("database_url",))
    parser.add_argument("--data-dir", default=None, help="use the database of a `minions up` data dir")


def database_url(args: argparse.Namespace) -> str:
    """The database an operator command works on (--database-url, MINIONS_DATABASE_URL, else the up.json
    of --data-dir or of here)."""
    return server_setting(config.from_args(args).database_url, args.data_dir, "database_url",
                          "pass --database-url or set MINIONS_DATABASE_URL")


def client_from_args(args: argparse.Namespace) -> MinionsClient:
    settings = client_settings(args.data_dir, args.api_url, args.token)
    if not settings.token:
        raise SystemExit("minions: no token: pass --token, set MINIONS_TOKEN, or start `minions up` on this "
                         "machine first")
    return MinionsClient(settings.api_url, settings.token, on_unreachable=_say_once_while_retrying())


def _say_once_while_retrying() -> Callable[[ApiUnreachable, float], None]:
    """The first connection that fails says so at once, rather than after the client's retries (half
    a minute): the user learns why nothing happens, and an API that is restarting is still waited for."""
    said = False

    def say(error: ApiUnreachable, _delay_s: float) -> None:
        nonlocal said
        if not said:
            print(f"minions: {error} Trying again for about half a minute.", file=sys.stderr, flush=True)
            said = True

    return say
