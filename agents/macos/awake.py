"""Keep the Mac awake while, and only while, a lease is held."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
from collections.abc import AsyncIterator

from minions.logging import get_logger

log = get_logger(__name__)


@contextlib.asynccontextmanager
async def keep_awake(system: str | None = None) -> AsyncIterator[None]:
    """On macOS, `caffeinate -i` (no idle sleep) for the duration of the block.

    `-w <our pid>` makes caffeinate exit by itself if the agent dies without cleaning up, so a
    crash can never keep the owner's Mac awake for good. Elsewhere this does nothing.
    """
    if (system or platform.system()) != "Darwin":
        yield
        return
    try:
        proc = await asyncio.create_subprocess_exec(
            "caffeinate",
            "-i",
            "-w",
            str(os.getpid()),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError as exc:
        log.warning("caffeinate_unavailable", error=str(exc))
        yield
        return
    try:
        yield
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
