"""The API's copies of small input objects (services/api/leasing/input_cache.py), on a real local store: one
of its own small inputs is read once and sliced after; anything else is read at every call, as the
store reads it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from minions.services.api.leasing.input_cache import InputCache
from minions.store.base import ObjectNotFound
from minions.store.local import LocalStore

DATA = b"".join(b'{"id": "r%d", "ms": 0}\n' % i for i in range(100))


async def _put(store: LocalStore, key: str, data: bytes = DATA) -> tuple[str, Path]:
    uri = await store.put_bytes(key, data)
    return uri, store.path_for(store.key_for(uri))


async def test_a_small_input_of_the_store_is_read_once_then_sliced(tmp_path: Path) -> None:
    store, cache = LocalStore(tmp_path), InputCache()
    uri, path = await _put(store, "inputs/search/p/t-0123.jsonl")
    assert await cache.read_bytes(store, uri, 0, 22) == await store.read_bytes(uri, 0, 22)
    path.unlink()  # every later range comes from the copy
    for start, end in ((22, 44), (len(DATA) - 23, len(DATA)), (5, 5)):
        assert await cache.read_bytes(store, uri, start, end) == DATA[start:end]
    assert len(cache) == 1
    with pytest.raises(ValueError, match="bad byte range"):
        await cache.read_bytes(store, uri, 10, 5)


async def test_other_objects_and_big_inputs_are_read_from_the_store_each_time(tmp_path: Path) -> None:
    store, cache = LocalStore(tmp_path), InputCache(object_bytes=len(DATA) - 1)
    # Outside inputs/ (its owner may change it), and an input over the size kept.
    for key in ("results/1/0.jsonl", "inputs/big.jsonl"):
        uri, path = await _put(store, key)
        assert await cache.read_bytes(store, uri, 22, 44) == DATA[22:44]
        path.unlink()
        with pytest.raises(ObjectNotFound):
            await cache.read_bytes(store, uri, 22, 44)
    # A missing input: the store's own error, every time.
    missing = store.uri_for("inputs/missing.jsonl")
    for _ in range(2):
        with pytest.raises(ObjectNotFound):
            await cache.read_bytes(store, missing, 0, 1)
    assert len(cache) == 0


async def test_the_copies_are_bounded_least_recently_used_first_out(tmp_path: Path) -> None:
    store, cache = LocalStore(tmp_path), InputCache(total_bytes=2 * len(DATA) + 10)
    a, b, c = [await _put(store, f"inputs/{name}.jsonl") for name in "abc"]
    for uri, _ in (a, b, a, c):  # a read again after b: b is the oldest when c comes
        await cache.read_bytes(store, uri, 0, 1)
    assert len(cache) == 2
    for _, path in (a, b, c):
        path.unlink()
    assert await cache.read_bytes(store, a[0], 0, 22) == DATA[:22]
    assert await cache.read_bytes(store, c[0], 0, 22) == DATA[:22]
    with pytest.raises(ObjectNotFound):
        await cache.read_bytes(store, b[0], 0, 22)


class CountingStore(LocalStore):
    """The real local store, counting its whole-object reads (not a double: every read is its own)."""

    reads = 0

    async def read_bytes(self, uri: str, start: int, end: int) -> bytes:
        self.reads += 1
        await asyncio.sleep(0.01)  # a read long enough for every claim below to miss while it runs
        return await super().read_bytes(uri, start, end)


async def test_claims_that_miss_together_share_one_read(tmp_path: Path) -> None:
    store, cache = CountingStore(tmp_path), InputCache()
    uri, _ = await _put(store, "inputs/search/p/t-0456.jsonl")
    ranges = [(22 * i, 22 * (i + 1)) for i in range(16)]
    got = await asyncio.gather(*(cache.read_bytes(store, uri, a, b) for a, b in ranges))
    assert got == [DATA[a:b] for a, b in ranges]
    assert store.reads == 1
    # A claim whose client goes away mid-read does not cancel the read the others wait on.
    other, _ = await _put(store, "inputs/search/p/t-0789.jsonl")
    first = asyncio.create_task(cache.read_bytes(store, other, 0, 22))
    second = asyncio.create_task(cache.read_bytes(store, other, 22, 44))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == DATA[22:44]
    assert store.reads == 2
