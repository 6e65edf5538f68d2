"""`python -m minions.services.watchdog` / `minions watchdog`: the watchdog service alone (production)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from minions import config, runtime
from minions.logging import configure
from minions.services.watchdog.service import Watchdog

SETTINGS = config.names_for(config.WATCHDOG)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, SETTINGS)


async def _serve(watchdog: Watchdog) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, watchdog.stop)
    await watchdog.run()


def run(args: argparse.Namespace) -> int:
    configure("watchdog")
    settings = config.from_args(args)
    if not settings.database_url:
        print("minions watchdog: MINIONS_DATABASE_URL is required", file=sys.stderr)
        return 2
    runtime.run(_serve(Watchdog(settings)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minions watchdog", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
