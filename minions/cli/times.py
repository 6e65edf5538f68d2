"""Times as the CLI prints them: in the reader's own timezone, always with that zone, so a time
read from a table is never mistaken for another zone's ("2026-05-04 14:03:12 CEST")."""

from __future__ import annotations

from datetime import UTC, datetime


def shown_time(value: str | datetime | None, missing: str = "-") -> str:
    """An API time (ISO 8601 with offset, or a datetime from the database) in local time with its
    zone's name; `missing` when there is none. A naive time is taken as UTC (what the API sends)."""
    if value is None or value == "":
        return missing
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    local = when.astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or local.strftime("%z"))
