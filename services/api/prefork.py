"""`minions api --workers N`: N processes serve one address (a pre-fork), so the API uses every
core: they share the listening socket `minions up` hands over, or each binds the address with
SO_REUSEPORT. Each worker builds its own app after the fork: its own pool, its own LISTEN
connection (claim waiters, tokens), so a NOTIFY wakes the waiting claims of every worker.

The parent only forks, forwards SIGINT/SIGTERM, and waits. When a worker dies unexpectedly the
parent stops the others and exits non-zero: the supervisor above it (`minions up`, systemd)
restarts the whole service, as it would restart a single-process API.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Callable

from minions.logging import get_logger

log = get_logger(__name__)


def run_workers(count: int, shared: socket.socket | None, serve: Callable[[], int]) -> int:
    """Forks `count` workers, each running serve() to its end (on `shared`, if given, which the
    parent then closes); returns the exit status."""
    children: list[int] = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # the worker: serve, and never return into the parent's code
            status = 1
            try:
                status = serve()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        children.append(pid)
    if shared is not None:
        shared.close()
    log.info("api_workers_started", pids=children)
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            _signal(child, signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    status = 0
    while children:
        pid, wait_status = os.wait()
        if pid not in children:
            continue
        children.remove(pid)
        code = os.waitstatus_to_exitcode(wait_status)
        if not stopping:
            log.error("api_worker_died", pid=pid, exit_code=code)
            stopping, status = True, 1
            for child in children:
                _signal(child, signal.SIGTERM)
        elif code != 0:
            status = status or 1
    return status


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
