"""Named queries: `sql/queries/<service>.sql` holds each statement a service runs under a
`-- name: <name>` header (Procrastinate's way), so no SQL hides in Python strings."""

from __future__ import annotations

import re
from functools import cache

from minions.db.paths import sql_dir

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        statement = "\n".join(
            line for line in body.strip().splitlines() if not line.lstrip().startswith("--")
        ).strip().rstrip(";")
        if name in queries:
            raise ValueError(f"query {name!r} defined twice")
        queries[name] = statement
    return queries


@cache
def load(service: str) -> dict[str, str]:
    """The named queries of one service (`api`, `splitter`, `watchdog`, `cli`)."""
    return parse((sql_dir() / "queries" / f"{service}.sql").read_text(encoding="utf-8"))


class Queries:
    """Attribute access to a service's queries: `Q.claim` is the SQL under `-- name: claim`."""

    def __init__(self, service: str) -> None:
        self._service = service

    def check(self) -> None:
        """Reads the file now: a missing or broken one fails here, not at the first statement."""
        load(self._service)

    def __getattr__(self, name: str) -> str:
        try:
            return load(self._service)[name]
        except KeyError:
            raise AttributeError(f"no query {name!r} in sql/queries/{self._service}.sql") from None
