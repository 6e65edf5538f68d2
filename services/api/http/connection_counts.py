"""The open connections of each client address, counted once for all of the API's workers, so that
MINIONS_MAX_CONNECTIONS_PER_IP holds per address however many processes serve it (prefork.py).

The counts live in an anonymous shared memory mapping that the API's parent makes before it forks
its workers: each worker inherits the same pages, and a lock (a POSIX semaphore, inherited the same
way) serializes the updates, which take microseconds. The table is `BUCKETS` buckets of `SLOTS`
entries (an address's 16-byte keyed hash and its count; an entry with count 0 is free): an address
lives in the bucket its hash names. The hash is keyed with a secret made at start, so a client
cannot choose addresses that crowd one bucket. An address that finds its bucket full (more than
`SLOTS` addresses with open connections land in it) is counted in its worker alone, under the same
limit: the cap then holds per worker for it, as it did before the counts were shared.

A worker that dies takes its counts with it only in the sense that they are never given back; the
parent then stops every worker (prefork.py), and the table goes with them. A single-process API
keeps the same table in private memory; so does a pre-fork on a host without POSIX semaphores (no
/dev/shm), where the cap then holds per worker, as a warning at start says.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import struct
import threading
from collections import Counter
from contextlib import AbstractContextManager
from dataclasses import dataclass
from hashlib import blake2b

from minions.logging import get_logger

log = get_logger(__name__)

BUCKETS = 8192
SLOTS = 8
_ENTRY = struct.Struct("=16sI")  # an address's keyed hash, its open connections


@dataclass(frozen=True)
class Held:
    """One admitted connection of an address: what `release` needs to give it back."""

    key: bytes
    offset: int | None  # its entry in the shared table; None: counted in this worker alone


class ConnectionCounts:
    """Open connections per address; for `workers` > 1, made before forking the workers that share it."""

    def __init__(self, *, workers: int = 1, buckets: int = BUCKETS, slots: int = SLOTS) -> None:
        self._buckets, self._slots = buckets, slots
        lock: AbstractContextManager[bool] = threading.Lock()
        flags = mmap.MAP_PRIVATE
        if workers > 1:
            try:
                lock, flags = multiprocessing.Lock(), mmap.MAP_SHARED  # both kept across fork
            except OSError as exc:
                log.warning("connection_cap_per_worker", workers=workers, reason=str(exc))
        self._lock = lock
        self._table = mmap.mmap(-1, buckets * slots * _ENTRY.size, flags=flags)  # anonymous: zeros
        self._secret = os.urandom(16)
        self._local: Counter[bytes] = Counter()  # addresses whose bucket was full, in this process

    def acquire(self, address: str, limit: int) -> Held | None:
        """Count one more connection of `address`, unless it holds `limit` already (None)."""
        digest = blake2b(address.encode(), digest_size=20, key=self._secret).digest()
        key = digest[:16]
        first = int.from_bytes(digest[16:], "little") % self._buckets * self._slots * _ENTRY.size
        with self._lock:
            free = None
            for offset in range(first, first + self._slots * _ENTRY.size, _ENTRY.size):
                entry, count = _ENTRY.unpack_from(self._table, offset)
                if count and entry == key:
                    if count >= limit:
                        return None
                    _ENTRY.pack_into(self._table, offset, key, count + 1)
                    return Held(key, offset)
                if not count and free is None:
                    free = offset
            if free is not None:
                _ENTRY.pack_into(self._table, free, key, 1)
                return Held(key, free)
        if self._local[key] >= limit:
            return None
        self._local[key] += 1
        return Held(key, None)

    def release(self, held: Held) -> None:
        if held.offset is None:
            self._local[held.key] -= 1
            if self._local[held.key] <= 0:
                del self._local[held.key]
            return
        with self._lock:
            entry, count = _ENTRY.unpack_from(self._table, held.offset)
            if entry == held.key and count > 0:
                _ENTRY.pack_into(self._table, held.offset, entry, count - 1)
