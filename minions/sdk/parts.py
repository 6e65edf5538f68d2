"""Compacted results fetched straight from the object store (API.md, `?format=parts`).

The API lists a completed task's result parts as presigned GETs with each part's SHA-256 and size;
the parts are fetched from the store directly (no API hop), a couple at a time, and handed on in
order, each only after it matched its SHA-256 and size: a tampered or truncated part is an error,
never silently passed on. Memory: at most PARTS_AHEAD parts (MINIONS_RESULT_PART_BYTES each, 64 MiB
by default) plus the one being handed on."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import yarl

from minions import readahead

PARTS_AHEAD = 2
Progress = Callable[[int, int], None]  # (bytes fetched, bytes in all)


class PartCorrupted(Exception):
    """A result part does not hold the bytes its listing names (size or SHA-256)."""


async def fetch_parts(listing: dict[str, Any], timeout: aiohttp.ClientTimeout,
                      progress: Progress | None = None) -> AsyncIterator[bytes]:
    """The bytes of every part in `listing`, in order, each verified before it is yielded."""
    total = int(listing.get("bytes", 0))
    fetched = 0
    # A session of its own: the API's bearer token must never travel to the store.
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def one(part: dict[str, Any]) -> bytes:
            nonlocal fetched
            async with session.get(yarl.URL(part["url"], encoded=True)) as resp:
                if resp.status != 200:
                    raise PartCorrupted(f"part {part['part']}: the store answered {resp.status}")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 20):
                    body += chunk
                    fetched += len(chunk)
                    if progress is not None:
                        progress(fetched, total)
                    if len(body) > part["bytes"]:
                        raise PartCorrupted(f"part {part['part']} holds more than its {part['bytes']} bytes")
            data = bytes(body)
            if len(data) != part["bytes"]:
                raise PartCorrupted(f"part {part['part']} holds {len(data)} bytes, not {part['bytes']}")
            digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
            if digest != part["sha256"]:
                raise PartCorrupted(f"part {part['part']} does not hold the bytes verified at complete "
                                    "(SHA-256 differs)")
            return data

        async def parts() -> AsyncIterator[dict[str, Any]]:
            for part in listing["parts"]:
                yield part

        async for data in readahead.ordered(parts(), one, PARTS_AHEAD):
            for piece in _slices(data, 1 << 20):
                yield piece


def _slices(data: bytes, size: int) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), size):
        yield bytes(view[start:start + size])
