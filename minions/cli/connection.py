"""Where client commands connect: flags, then MINIONS_API_URL / MINIONS_TOKEN, then the up.json a
local `minions up` wrote, so `minions status` just works on the same machine, from any folder.

up.json is looked for in --data-dir, else ./.minions (a `minions up` started here), else the user's
state dir (platformdirs: $XDG_STATE_HOME/minions, ~/.local/state/minions by default on Linux), where
each `minions up` also publishes its up.json while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import Any

from minions import config, jsoncodec
from minions.sdk import MinionsClient
from minions.sdk.client import DEFAULT_API_URL

DEFAULT_DATA_DIR = Path(".minions")


def add_arguments(parser: argparse.ArgumentParser, *, json_flag: bool = True) -> None:
    parser.add_argument("--api-url", default=None,
                        help="API URL (default: env MINIONS_API_URL, else up.json, else http://127.0.0.1:8080)")
    parser.add_argument("--token", default=None, help="bearer token (default: env MINIONS_TOKEN, else up.json)")
    parser.add_argument("--data-dir", default=None, type=Path,
                        help="the data dir of a `minions up` whose up.json to use (default: ./.minions if it "
                             f"has one, else {state_dir() / 'up.json'})")
    if json_flag:
        parser.add_argument("--json", action="store_true", help="machine-readable JSON output (one document)")


def state_dir() -> Path:
    """Client state of this user (platformdirs' user state dir; honours XDG_STATE_HOME)."""
    from platformdirs import user_state_path

    return user_state_path("minions", appauthor=False)


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = jsoncodec.loads(path.read_bytes())
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def up_json_path(data_dir: Path | None) -> Path:
    if data_dir is not None:
        return data_dir / "up.json"
    local = DEFAULT_DATA_DIR / "up.json"
    return local if local.is_file() else state_dir() / "up.json"


def read_up_json(data_dir: Path | None) -> dict[str, str]:
    return _read(up_json_path(data_dir))


def server_setting(given: str, data_dir: str | None, key: str, how: str) -> str:
    """A server-side setting of an operator command (the database, the store): the flag or variable
    if `given`, else what the `minions up` of `data_dir` (or of here) wrote; `how` says how to give it."""
    value = given or read_up_json(None if data_dir is None else Path(data_dir)).get(key, "")
    if not value:
        raise SystemExit(f"minions: no {key.replace('_', ' ')}: {how}, or run `minions up` here first")
    return value


def publish_up_json(data_dir: Path, info: dict[str, str]) -> None:
    """Written by `minions up` once it is up: the state dir's up.json names this data dir."""
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = folder / f"up.json.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the admin token
    with os.fdopen(fd, "wb") as f:
        f.write(jsoncodec.dumps({**info, "data_dir": str(data_dir)}))
    tmp.replace(folder / "up.json")


def withdraw_up_json(data_dir: Path) -> None:
    """On stop: remove the state dir's up.json if it still names this data dir (not a later one's)."""
    path = state_dir() / "up.json"
    if _read(path).get("data_dir") == str(data_dir):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def client_settings(data_dir: Path | None, api_url: str | None = None,
                    token: str | None = None) -> config.ClientSettings:
    """Where a client connects, the one lookup of CLI and SDK: the flag, else the environment
    (config.ClientSettings), else the up.json of a local `minions up`, else the default URL; the
    token may come back empty (the caller says how to give one)."""
    env = config.client_from_env()
    up = read_up_json(data_dir)
    return config.ClientSettings(api_url=api_url or env.api_url or up.get("api_url") or DEFAULT_API_URL,
                                 token=token or env.token or up.get("admin_token") or "")


def client_from_args(args: argparse.Namespace) -> MinionsClient:
    settings = client_settings(args.data_dir, args.api_url, args.token)
    if not settings.token:
        raise SystemExit("minions: no token: pass --token, set MINIONS_TOKEN, or start `minions up` on this "
                         "machine first")
    return MinionsClient(settings.api_url, settings.token)
