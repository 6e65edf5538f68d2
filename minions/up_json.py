"""The up.json of a local `minions up`: where it lies, reading it, publishing and withdrawing it.

`minions up` writes up.json into its data dir (the API URL, the admin token, the database and store
it started), and, while it runs, publishes a copy in the user's state dir (platformdirs:
$XDG_STATE_HOME/minions, ~/.local/state/minions by default on Linux) that names that data dir.
Clients (the CLI and the SDK) read it so that `minions status` or `MinionsClient.from_env()` just
work on the same machine, from any folder: up.json is looked for in the data dir given, else
./.minions (a `minions up` started here), else the state dir.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from minions import jsoncodec

DEFAULT_DATA_DIR = Path(".minions")


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
