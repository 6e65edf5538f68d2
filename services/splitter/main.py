"""`python -m minions.services.splitter`: the splitter service.

One listener connection (LISTEN tasks) wakes `--workers` split workers, each on its own connection.
Workers also sweep on start, after every reconnect and every sweep interval, so no task waits on a
lost notification. SIGTERM/SIGINT stop it at once: a split cut short resumes in the next splitter.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

import asyncpg

from minions import logging as minions_logging
from minions import runtime
from minions.backoff import Backoff
from minions.config import SPLITTER, ConfigError, Settings, add_arguments, from_args, names_for
from minions.db.connect import CONNECTION_ERRORS, connect
from minions.services.splitter.gateway import SplitterGateway
from minions.services.splitter.listener import Wakeup, task_listener
from minions.services.splitter.worker import RetryBook, Worker
from minions.store.base import ObjectStore
from minions.store.factory import open_store

SETTINGS = names_for(SPLITTER)

log = minions_logging.get_logger("splitter")


def parse_args(argv: Sequence[str] | None) -> tuple[Settings, int]:
    parser = argparse.ArgumentParser(prog="python -m minions.services.splitter",
                                     description="Split submitted tasks into subtasks.")
    add_arguments(parser, SETTINGS)
    parser.add_argument("--workers", type=int, default=2, metavar="N",
                        help="tasks split at once by this process (default 2)")
    args = parser.parse_args(argv)
    settings = from_args(args)
    missing = [env for env, value in (("MINIONS_DATABASE_URL", settings.database_url),
                                      ("MINIONS_STORE", settings.store)) if not value]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} must be set")
    if args.workers < 1:
        raise ConfigError("--workers must be >= 1")
    return settings, args.workers


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, workers = parse_args(argv)
    except ConfigError as exc:
        print(f"splitter: {exc}", file=sys.stderr)
        return 2
    minions_logging.configure("splitter")
    return runtime.run(serve(settings, workers))


async def serve(settings: Settings, workers: int) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = await _open_store(settings, stop)
    if store is None:
        return 0 if stop.is_set() else 1
    wakeup = Wakeup()
    retries = RetryBook(settings.sweep_interval_s)
    parts = [
        task_listener(settings.database_url, wakeup, probe_interval_s=settings.listen_probe_s).run(),
        *(Worker(f"w{i}", settings.database_url, store, wakeup, retries,
                 sweep_interval_s=settings.sweep_interval_s).run() for i in range(workers)),
    ]
    tasks = [asyncio.create_task(part) for part in parts]
    stopping = asyncio.create_task(stop.wait())
    log.info("splitter_started", workers=workers, store=store.root_uri,
             sweep_interval_s=settings.sweep_interval_s)
    try:
        done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in [stopping, *tasks]:
            task.cancel()
        results = await asyncio.gather(stopping, *tasks, return_exceptions=True)
        await store.close()
    # The listener and workers run until cancelled: one that ended on its own is a bug.
    failed = [r for r in results[1:] if not isinstance(r, asyncio.CancelledError)]
    if stopping not in done or failed:
        log.error("splitter_part_ended", results=[repr(r) for r in failed])
        return 1
    log.info("splitter_stopped")
    return 0


async def _open_store(settings: Settings, stop: asyncio.Event) -> ObjectStore | None:
    """The store, once the database is there and migrated (its signing key is the mark; the splitter
    signs no URL)."""
    key = await _signing_key(settings.database_url, stop)
    if key is None:
        return None
    try:
        return open_store(settings.store, s3_endpoint_url=settings.s3_endpoint_url)
    except ValueError as exc:
        log.error("store_unavailable", error=str(exc))
        return None


async def _signing_key(database_url: str, stop: asyncio.Event) -> str | None:
    backoff = Backoff(max_s=5.0)
    while not stop.is_set():
        try:
            conn = await connect(database_url)
            try:
                key = await SplitterGateway(conn).store_signing_key()
            finally:
                await conn.close()
            if key:
                return key
            log.error("signing_key_missing", hint="minion_settings holds no store_signing_key; is the schema migrated?")
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
            # Services may start before the database (or its migration); wait rather than crash.
            log.warning("waiting_for_database", error=repr(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=backoff.next_delay())
    return None
