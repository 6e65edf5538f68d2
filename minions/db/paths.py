"""Where the schema lives: the `sql/` folder, shipped inside the `minions` package as package data
(the package `minions.sql` is the repository's top-level `sql/`), read through `importlib.resources`
so an installed wheel finds it as a checkout does. MINIONS_SQL_DIR overrides it (a folder on disk)."""

from __future__ import annotations

import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path


def sql_dir() -> Traversable:
    override = os.environ.get("MINIONS_SQL_DIR")
    if override:
        return Path(override)
    return files("minions.sql")
