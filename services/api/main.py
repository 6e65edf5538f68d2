"""`python -m minions.services.api` / `minions api`: the API service alone (production)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys

from aiohttp import web
from aiohttp.log import access_logger

from minions import config
from minions.logging import configure, get_logger
from minions.runtime import install_uvloop
from minions.services.api.access_log import AccessLogger
from minions.services.api.app import SchemaMissing, create_app
from minions.services.api.slow_clients import KEEPALIVE_S, ClientLimits, GuardedAppRunner

SETTINGS = ("database_url", "store", "s3_endpoint_url", "host", "port", "public_url", "heartbeat_interval_s",
            "lease_timeout_s", "max_attempts", "long_poll_s", "straggler_factor", "listen_probe_s",
            "max_input_bytes", "max_output_bytes", "team_input_quota_bytes", "header_timeout_s",
            "body_timeout_s", "body_min_rate", "max_connections_per_ip", "max_claim", "inline_input_bytes",
            "inline_output_bytes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, SETTINGS)


def run(args: argparse.Namespace) -> int:
    configure("api")
    settings = config.from_args(args)
    if not settings.database_url or not settings.store:
        print("minions api: MINIONS_DATABASE_URL and MINIONS_STORE are required", file=sys.stderr)
        return 2
    install_uvloop()
    get_logger(__name__).info("api_starting", host=settings.host, port=settings.port)
    try:
        asyncio.run(serve(settings))
    except SchemaMissing as exc:
        print(f"minions api: {exc}", file=sys.stderr)
        return 1
    return 0


async def serve(settings: config.Settings) -> None:
    """web.run_app's job, with a runner whose server limits slow clients (slow_clients.py)."""
    runner = GuardedAppRunner(create_app(settings), limits=ClientLimits.from_settings(settings),
                              access_log_class=AccessLogger, access_log=access_logger,
                              keepalive_timeout=KEEPALIVE_S, shutdown_timeout=5)
    await runner.setup()
    # Under `minions up` the port is bound by the parent and handed over (MINIONS_LISTEN_FD), so this
    # process serves exactly the socket `minions up` checked and holds; alone, it binds host:port.
    listen_fd = os.environ.get("MINIONS_LISTEN_FD")
    site: web.BaseSite = (web.SockSite(runner, socket.socket(fileno=int(listen_fd))) if listen_fd
                          else web.TCPSite(runner, settings.host, settings.port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await site.start()
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minions api", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
