"""`Retry-After` (RFC 9110 §10.2.3): how long a server asked a client to wait before retrying.

One parser for every client of the API (the SDK, the agent): both wait at least as long as the
server asked when it answers 503 or 429, instead of their own, shorter, backoff.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

MAX_RETRY_AFTER_S = 300.0  # a misconfigured proxy's "come back tomorrow" must not stall a client


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or an HTTP date), capped at
    MAX_RETRY_AFTER_S; None when there is no usable header."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    delay = when.timestamp() - (time.time() if now is None else now)
    return min(max(delay, 0.0), MAX_RETRY_AFTER_S)
