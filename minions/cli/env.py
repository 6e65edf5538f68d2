"""`minions env`: the shell lines that point clients at the running `minions up`, for
`eval "$(minions env)"`: MINIONS_API_URL and MINIONS_TOKEN (what the SDK, the CLI and README's OpenAI
block read), and with --openai OPENAI_BASE_URL and OPENAI_API_KEY too (what a bare `OpenAI()` reads;
opt-in, since it replaces a real OpenAI key in that shell). Read from the up.json that `minions up`
wrote (minions/up_json.py), once its API answers."""

from __future__ import annotations

import argparse
import shlex
import sys
import urllib.error
import urllib.request
from pathlib import Path

from minions.up_json import read_up_json, state_dir, up_json_path

HEALTH_TIMEOUT_S = 3.0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("env", help="print the export lines that point clients at the running `minions up`",
                       description="Print `export MINIONS_API_URL=… MINIONS_TOKEN=…` lines for the running "
                                   "`minions up` (its admin token), for `eval \"$(minions env)\"`.")
    p.add_argument("--data-dir", default=None, type=Path,
                   help="the data dir of the `minions up` (default: ./.minions if it has an up.json, else the "
                        f"running one's, {state_dir() / 'up.json'})")
    p.add_argument("--openai", action="store_true",
                   help="also OPENAI_BASE_URL and OPENAI_API_KEY, for code that builds a bare OpenAI() "
                        "(replaces an OpenAI key set in that shell)")
    p.set_defaults(handler=env)


def _answers(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/api/v1/health", timeout=HEALTH_TIMEOUT_S) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def env(args: argparse.Namespace) -> int:
    up = read_up_json(args.data_dir)
    api_url, token = up.get("api_url", ""), up.get("admin_token", "")
    if not api_url or not token:
        print(f"minions: no `minions up` found (no up.json at {up_json_path(args.data_dir)}): start "
              "`minions up`, or pass --data-dir", file=sys.stderr)
        return 1
    if not _answers(api_url):
        print(f"minions: the `minions up` of {up_json_path(args.data_dir)} does not answer at {api_url}: "
              "is it still running?", file=sys.stderr)
        return 1
    lines = {"MINIONS_API_URL": api_url, "MINIONS_TOKEN": token}
    if args.openai:
        lines |= {"OPENAI_BASE_URL": f"{api_url}/v1", "OPENAI_API_KEY": token}
    for name, value in lines.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0
