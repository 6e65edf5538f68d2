"""Process runtime: the services (API, splitter, watchdog) and the agent run their event loop through
`run`, on uvloop where it is installed, else on asyncio's own loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run, on uvloop's loop when uvloop is importable (a wheel without it still runs)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: T = uvloop.run(main)
    return result
