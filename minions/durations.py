"""Durations as people write them on a command line or in a query string: `90` (seconds), `90s`,
`15m`, `12h`, `7d`, `2w`. One reader for every place that takes one (token expiry, usage windows)."""

from __future__ import annotations

import re

# What duration_s reads, also as a schema's pattern: ASCII digits, an optional unit, spaces around.
DURATION_PATTERN = r"^[ \t]*[0-9]+(\.[0-9]+)?[smhdwSMHDW]?[ \t]*$"
_DURATION = re.compile(DURATION_PATTERN)
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_EXAMPLES = "3600, 90m, 12h, 7d or 2w"


def duration_s(text: str) -> float | None:
    """`text` as seconds, or None when it is not a duration."""
    if not _DURATION.fullmatch(text):
        return None
    text = text.strip(" \t")
    unit = text[-1].lower() if text[-1].isalpha() else ""
    return float(text[:-1] if unit else text) * _UNITS[unit]
