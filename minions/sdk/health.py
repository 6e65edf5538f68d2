"""Waiting for an API to answer its health check (start-up of `minions up`, tests)."""

from __future__ import annotations

import asyncio
import time

import aiohttp


async def wait_until_healthy(api_url: str, timeout_s: float = 60.0) -> bool:
    """True once GET /api/v1/health answers 200; False if it has not within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{api_url}/api/v1/health") as resp:
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.1)
    return False
