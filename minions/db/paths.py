"""Where the schema lives: the repository's `sql/` folder (MINIONS_SQL_DIR overrides)."""

from __future__ import annotations

import os
from pathlib import Path


def sql_dir() -> Path:
    override = os.environ.get("MINIONS_SQL_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "sql"
