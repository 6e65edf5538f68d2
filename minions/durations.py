"""Durations as people write them on a command line or in a query string: `90` (seconds), `90s`,
`15m`, `12h`, `7d`, `2w`. One reader for every place that takes one (token expiry, usage windows)."""

from __future__ import annotations

import re

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_EXAMPLES = "3600, 90m, 12h, 7d or 2w"


def duration_s(text: str) -> float | None:
    """`text` as seconds, or None when it is not a duration (case and surrounding spaces aside)."""
    match = _DURATION.fullmatch(text.strip().lower())
    return float(match.group(1)) * _UNITS[match.group(2)] if match else None
