"""What the usage account (sql/schema/16_usage.sql: minion_usage) can be asked: a window back from
now and a grouping. The API and the CLI check a request with the same rules, so a bad `--since` is
refused before any request is made."""

from __future__ import annotations

from typing import Final

from minions.durations import DURATION_EXAMPLES, DURATION_PATTERN, duration_s

USAGE_BY: Final = ("team", "executor", "owner")
DEFAULT_SINCE: Final = "7d"
MAX_SINCE_S: Final = 10 * 365 * 86400.0  # longer than any retention keeps attempts
SINCE_RULE: Final = f"a duration back from now such as {DURATION_EXAMPLES} (above 0, at most 10 years)"
BY_RULE: Final = f"one of {', '.join(USAGE_BY)}"
SINCE_PATTERN: Final = DURATION_PATTERN  # the form; the bounds are SINCE_RULE's


def since_s(text: str) -> float | None:
    """The window `text` names, in seconds; None when it breaks SINCE_RULE."""
    seconds = duration_s(text)
    return seconds if seconds is not None and 0 < seconds <= MAX_SINCE_S else None
