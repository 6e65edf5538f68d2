"""Small input objects of this store, read whole once and sliced for each claim that sends a range.

A claim sends each small input range inline (`claims.py` `_inline_inputs`), and an
unbatched claim reads its one range from the store: a thread hop on the local store, a ranged GET on
S3, once per subtask. In bench/drain.py's http-inline1 arm (20,000 one-record subtasks of one 500 KB
input object) that hop was ~20% of the API's CPU (py-spy, docs/benchmarks/drain.md "The claim's plans read by index").

Only the API's own input objects are kept: those under the store's `inputs/` prefix, which the API
writes once and never rewrites (named by the task's request hash, an upload's id or its SHA-256), so
a copy here is the object for as long as it exists. An input named by an outside URI may be changed
by its owner and is read from the store at every claim. A deleted object's copy is never asked for
again (its subtasks went with its task) and ages out. Bounded: objects up to OBJECT_BYTES, up to
TOTAL_BYTES in all, least recently used first out. Claims that miss together (a fleet's first claims
of a new task) share one read: the first starts it, the others wait for it.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict

from minions.store.base import ObjectStore, check_range

OBJECT_BYTES = 4 * 1024 * 1024
TOTAL_BYTES = 64 * 1024 * 1024
# Objects not to keep (too big, or missing), remembered so their size is asked once (a URI is a few
# dozen bytes).
NOT_KEPT_REMEMBERED = 10_000


class InputCache:
    def __init__(self, object_bytes: int = OBJECT_BYTES, total_bytes: int = TOTAL_BYTES) -> None:
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._not_kept: OrderedDict[str, None] = OrderedDict()
        self._object_bytes = object_bytes
        self._total_bytes = total_bytes
        self._held = 0
        self._loading: dict[str, asyncio.Task[bytes | None]] = {}

    async def read_bytes(self, store: ObjectStore, uri: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object at `uri`, as `store.read_bytes` gives them (and raising
        as it does), from a whole copy when the object is one of this store's small inputs."""
        check_range(start, end)
        data = self._objects.get(uri)
        if data is None:
            data = await self._load(store, uri)
            if data is None:
                return await store.read_bytes(uri, start, end)
        else:
            self._objects.move_to_end(uri)
        return data[start:end]

    async def _load(self, store: ObjectStore, uri: str) -> bytes | None:
        """The whole object, kept; None when it is not one to keep. One read at a time per object:
        a claim that misses while another reads it waits for that read."""
        if uri in self._not_kept or not uri.startswith(f"{store.root_uri}/inputs/"):
            return None
        loading = self._loading.get(uri)
        if loading is None:
            loading = asyncio.create_task(self._read_whole(store, uri))
            self._loading[uri] = loading
            loading.add_done_callback(functools.partial(self._loaded, uri))
        # Shielded: a waiter cancelled (its client gone) does not cancel the read the others wait on.
        return await asyncio.shield(loading)

    def _loaded(self, uri: str, loading: asyncio.Task[bytes | None]) -> None:
        del self._loading[uri]
        if not loading.cancelled():
            loading.exception()  # retrieved here too: every waiter may have gone

    async def _read_whole(self, store: ObjectStore, uri: str) -> bytes | None:
        size = await store.size(uri)
        if size is None or size > self._object_bytes:
            self._not_kept[uri] = None
            while len(self._not_kept) > NOT_KEPT_REMEMBERED:
                self._not_kept.popitem(last=False)
            return None
        data = await store.read_bytes(uri, 0, size)
        self._objects[uri] = data
        self._held += len(data)
        while self._held > self._total_bytes:
            self._held -= len(self._objects.popitem(last=False)[1])
        return data

    def __len__(self) -> int:
        return len(self._objects)
