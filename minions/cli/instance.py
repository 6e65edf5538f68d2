"""One `minions up` per data dir, and only on a port it holds.

The data dir is locked with `filelock` on `<data-dir>/up.lock` (an exclusive `flock` on Unix), held
for the life of the process: the kernel drops it when the process dies, even by kill -9, so a crash
never leaves a stale lock. The file names the holder (pid, API URL), so a second `minions up` can
say which instance is in the way. Both checks run before anything starts: a refused `minions up`
touches nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import filelock

from minions import jsoncodec

LOCK_FILE = "up.lock"


class InstanceError(RuntimeError):
    """`minions up` cannot start here; the message says why and what to do."""


def _holder(path: Path) -> dict[str, Any]:
    try:
        value = jsoncodec.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


class DataDirLock:
    """The exclusive lock of one data dir; `acquire` raises InstanceError naming the holder."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self._lock = filelock.FileLock(self.path, timeout=0, mode=0o600)

    def acquire(self, api_url: str) -> None:
        try:
            self._lock.acquire()
        except filelock.Timeout:
            holder = _holder(self.path)
            raise InstanceError(
                f"another `minions up` is running on the data dir {self.path.parent} (pid "
                f"{holder.get('pid', '?')}, API {holder.get('api_url', '?')}); stop it first, or pass another "
                "--data-dir") from None
        # Written through a descriptor of its own: the lock lives on filelock's, which stays open.
        self.path.write_bytes(jsoncodec.dumps({"pid": os.getpid(), "api_url": api_url, "started_at": time.time()}))

    def release(self) -> None:
        if self._lock.is_locked:
            with contextlib.suppress(OSError):
                self.path.write_bytes(b"")
            self._lock.release()


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind and listen on host:port here, before anything starts, and hand the socket to the API
    child (MINIONS_LISTEN_FD): the check and the claim of the port are one step, so no other
    program can take it in between, a restarted API child cannot crash-loop on it, and the health
    check can only be answered by this instance's API. Bound as aiohttp binds (SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(512)
    except OSError as exc:
        listener.close()
        raise InstanceError(f"port {port} on {host} is in use ({exc.strerror}): another program or another "
                            "`minions up` listens there; pass --port (or MINIONS_PORT)") from None
    listener.set_inheritable(True)
    return listener
