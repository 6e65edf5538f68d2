"""`python -m minions.services.api` / `minions api`: the API service alone (production)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from aiohttp import web

from minions import config
from minions.logging import configure, get_logger
from minions.runtime import install_uvloop
from minions.services.api.app import SchemaMissing, create_app

SETTINGS = ("database_url", "store", "s3_endpoint_url", "host", "port", "public_url", "heartbeat_interval_s",
            "lease_timeout_s", "max_attempts", "long_poll_s", "straggler_factor")


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
    # Under `minions up` the port is bound by the parent and handed over (MINIONS_LISTEN_FD), so this
    # process serves exactly the socket `minions up` checked and holds; alone, it binds host:port.
    listen_fd = os.environ.get("MINIONS_LISTEN_FD")
    where: dict[str, Any] = ({"sock": socket.socket(fileno=int(listen_fd))} if listen_fd
                             else {"host": settings.host, "port": settings.port})
    try:
        web.run_app(create_app(settings), **where, print=None, access_log=None, shutdown_timeout=5)
    except SchemaMissing as exc:
        print(f"minions api: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minions api", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
