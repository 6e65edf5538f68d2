"""Serve an aiohttp app on a free local port for a test."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

from aiohttp import web


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(app: web.Application, port: int = 0) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port or free_port())
    await site.start()
    try:
        yield site.name.rstrip("/")
    finally:
        await runner.cleanup()
