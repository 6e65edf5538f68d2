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

from minions import config, runtime
from minions.logging import configure, get_logger
from minions.services.api import prefork
from minions.services.api.app import SchemaMissing, create_app
from minions.services.api.http.access_log import AccessLogger
from minions.services.api.http.connection_counts import ConnectionCounts
from minions.services.api.http.slow_clients import KEEPALIVE_S, ClientLimits, GuardedAppRunner

SETTINGS = config.names_for(config.API)


# Names the process that answered, on every response: which worker of a pre-forked API served it.
WORKER_HEADER = "X-Minions-Worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, SETTINGS)
    parser.add_argument("--workers", type=int, default=int(os.environ.get("MINIONS_API_WORKERS", "1")),
                        help="processes serving the one listening socket, each with its own pool and "
                             "LISTEN connection (env MINIONS_API_WORKERS; default 1)")


def run(args: argparse.Namespace) -> int:
    configure("api")
    settings = config.from_args(args)
    if not settings.database_url or not settings.store:
        print("minions api: MINIONS_DATABASE_URL and MINIONS_STORE are required", file=sys.stderr)
        return 2
    if args.workers < 1:
        print("minions api: --workers must be at least 1", file=sys.stderr)
        return 2
    get_logger(__name__).info("api_starting", host=settings.host, port=settings.port, workers=args.workers)
    if args.workers == 1:
        return _serve_here(settings, None)
    # Under `minions up` the workers share the socket it handed over; alone, each worker binds
    # host:port with SO_REUSEPORT, and the kernel spreads new connections across them. Either way one
    # address's connections are counted once for all of them (made here, before the fork).
    listen_fd = os.environ.get("MINIONS_LISTEN_FD")
    shared = socket.socket(fileno=int(listen_fd)) if listen_fd else None
    counts = ConnectionCounts(workers=args.workers)
    return prefork.run_workers(args.workers, shared,
                               lambda: _serve_here(settings, shared, reuse_port=True, counts=counts))


def _serve_here(settings: config.Settings, sock: socket.socket | None, *, reuse_port: bool = False,
                counts: ConnectionCounts | None = None) -> int:
    try:
        runtime.run(serve(settings, sock, reuse_port=reuse_port, counts=counts))
    except SchemaMissing as exc:
        print(f"minions api: {exc}", file=sys.stderr)
        return 1
    return 0


async def _name_worker(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers[WORKER_HEADER] = str(os.getpid())


async def serve(settings: config.Settings, sock: socket.socket | None = None, *, reuse_port: bool = False,
                counts: ConnectionCounts | None = None) -> None:
    """web.run_app's job, with a runner whose server limits slow clients (slow_clients.py); `counts`:
    the connection counts shared with the other workers, if any."""
    app = create_app(settings)
    app.on_response_prepare.append(_name_worker)
    runner = GuardedAppRunner(app, limits=ClientLimits.from_settings(settings), counts=counts,
                              access_log_class=AccessLogger, access_log=access_logger,
                              keepalive_timeout=KEEPALIVE_S, shutdown_timeout=5)
    await runner.setup()
    # Under `minions up` the port is bound by the parent and handed over (MINIONS_LISTEN_FD), so this
    # process serves exactly the socket `minions up` checked and holds; alone, it binds host:port.
    listen_fd = os.environ.get("MINIONS_LISTEN_FD")
    if sock is None and listen_fd:
        sock = socket.socket(fileno=int(listen_fd))
    site: web.BaseSite = (web.SockSite(runner, sock) if sock is not None
                          else web.TCPSite(runner, settings.host, settings.port, reuse_port=reuse_port or None))
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
