"""Where client commands connect: flags, then MINIONS_API_URL / MINIONS_TOKEN, then the up.json a
local `minions up` wrote (so `minions status` just works next to it)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from minions import jsoncodec
from minions.sdk import MinionsClient

DEFAULT_DATA_DIR = Path(".minions")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-url", default=None, help="API URL (env MINIONS_API_URL; else up.json)")
    parser.add_argument("--token", default=None, help="bearer token (env MINIONS_TOKEN; else up.json)")
    parser.add_argument("--data-dir", default=None, type=Path,
                        help="where `minions up` keeps its state (default ./.minions)")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON output")


def read_up_json(data_dir: Path | None) -> dict[str, str]:
    path = (data_dir or DEFAULT_DATA_DIR) / "up.json"
    if not path.exists():
        return {}
    value = jsoncodec.loads(path.read_bytes())
    return value if isinstance(value, dict) else {}


def client_from_args(args: argparse.Namespace) -> MinionsClient:
    up = read_up_json(args.data_dir)
    api_url = args.api_url or os.environ.get("MINIONS_API_URL") or up.get("api_url") or "http://127.0.0.1:8080"
    token = args.token or os.environ.get("MINIONS_TOKEN") or up.get("admin_token") or ""
    if not token:
        raise SystemExit("minions: no token: pass --token, set MINIONS_TOKEN, or run `minions up` here first")
    return MinionsClient(api_url, token)
