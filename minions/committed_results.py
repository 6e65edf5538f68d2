"""Reading committed results, verified: the bytes a done subtask's row names, served only once they
match the SHA-256 and size recorded at complete (services/api/leasing/complete.py writes them).

The API's results routes and spot checks and the watchdog's compaction (result_parts.py) all read
committed results, so this half lives in the core. It streams: memory is O(one chunk) per call
(plus at most VERIFY_IN_MEMORY when serving a small result), and hashing runs in worker threads,
never on the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

from minions.store.base import ObjectNotFound, ObjectStore, StoreError

# Results up to this size are read once, checked and then sent from memory; larger ones are read
# twice (check, then send) so that no byte is sent before the whole object is known to be intact.
VERIFY_IN_MEMORY = 8 * 1024 * 1024


class ResultCorrupted(StoreError):
    """A committed result no longer holds the bytes verified at complete: never served."""


class ResultCompacted(ObjectNotFound):
    """A result whose bytes its row kept (sql/schema/07_results.sql) was dropped after its task's compaction: it is read
    from the task's result parts now."""


async def read_committed(store: ObjectStore, sub: Any) -> AsyncIterator[bytes]:
    """A done subtask's committed result (a row with output_key, result_key, result_sha256,
    result_bytes, result_data): the bytes its row kept, or the verified copy made at complete, served
    only if it still holds the bytes verified then. A result committed before verified copies existed
    (no SHA-256) is read from its attempt's output, as it was then. ObjectNotFound when the row's
    bytes were dropped (its task was compacted: results are read from its parts)."""
    if sub["result_data"] is not None:
        yield bytes(sub["result_data"])
        return
    if _dropped_from_row(sub):
        raise ResultCompacted(f"subtask {sub['subtask_id']}'s result was compacted into its task's parts")
    if sub["result_key"] is None:
        async for chunk in store.read(store.uri_for(sub["output_key"])):
            yield chunk
        return
    async for chunk in read_verified(store, store.uri_for(sub["result_key"]), sub["result_bytes"],
                                     sub["result_sha256"]):
        yield chunk


def _dropped_from_row(sub: Any) -> bool:
    """A result recorded (SHA-256 and size) with no object and no bytes: its row kept them until gc
    dropped them after the task's compaction (sql/schema/07_results.sql; minion_complete never commits that shape)."""
    return bool(sub["result_sha256"] is not None and sub["result_key"] is None and sub["result_data"] is None)


def committed_uri(store: ObjectStore, sub: Any) -> str:
    """Where a done subtask's result is read from (for logs)."""
    if sub["result_data"] is not None or _dropped_from_row(sub):
        return f"(subtask {sub['subtask_id']}'s row)"
    return store.uri_for(sub["result_key"] if sub["result_key"] is not None else sub["output_key"])


async def read_verified(store: ObjectStore, uri: str, size: int, sha256: bytes) -> AsyncIterator[bytes]:
    """The bytes of a committed result, each sent only after the whole object matched `size` and
    `sha256`; ResultCorrupted otherwise (ObjectNotFound when it is gone)."""
    if size <= VERIFY_IN_MEMORY:
        chunks = [chunk async for chunk in _checked(store, uri, size, sha256)]
        for chunk in chunks:
            yield chunk
        return
    async for _ in _checked(store, uri, size, sha256):
        pass
    # Checked again as it is sent: the object changed between the passes only if someone with the
    # store's own credentials replaced it, and then the response breaks off with an error.
    async for chunk in _checked(store, uri, size, sha256):
        yield chunk


async def _checked(store: ObjectStore, uri: str, size: int, sha256: bytes) -> AsyncIterator[bytes]:
    digest = hashlib.sha256()
    seen = 0
    async for chunk in store.read(uri):
        seen += len(chunk)
        if seen > size:
            raise ResultCorrupted(f"it holds more than the {size} bytes verified at complete")
        await asyncio.to_thread(digest.update, chunk)
        yield chunk
    if seen != size:
        raise ResultCorrupted(f"it holds {seen} bytes, not the {size} verified at complete")
    if digest.digest() != sha256:
        raise ResultCorrupted("it no longer holds the bytes verified at complete (SHA-256 differs)")
