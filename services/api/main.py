"""`python -m minions.services.api` / `minions api`: the API service alone (production)."""

from __future__ import annotations

import argparse
import sys

from aiohttp import web

from minions import config
from minions.logging import configure, get_logger
from minions.runtime import install_uvloop
from minions.services.api.access_log import AccessLogger
from minions.services.api.app import create_app

SETTINGS = ("database_url", "store", "s3_endpoint_url", "host", "port", "public_url", "heartbeat_interval_s",
            "lease_timeout_s", "max_attempts", "long_poll_s", "straggler_factor", "listen_probe_s",
            "max_input_bytes", "max_output_bytes", "team_input_quota_bytes")


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
    web.run_app(create_app(settings), host=settings.host, port=settings.port, print=None,
                access_log_class=AccessLogger, shutdown_timeout=5)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minions api", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
