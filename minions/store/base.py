"""The one object-store interface. Two implementations: S3 (aioboto3, presigned URLs) and a local
folder served by the API through signed, expiring URLs. Executors only ever see URLs.

Objects are named by URI (`s3://bucket/key`, `file:///abs/path`); the store writes new objects
under its own root by *key* (`inputs/…`, `outputs/…`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class StoreError(Exception):
    """An object-store operation failed (the message says which object and why)."""


class ObjectNotFound(StoreError):
    pass


class ObjectStore(Protocol):
    @property
    def root_uri(self) -> str:
        """`s3://bucket/prefix` or `file:///path`, without a trailing slash."""
        ...

    def uri_for(self, key: str) -> str:
        """The URI of the object this store keeps under `key`."""
        ...

    def readable(self, uri: str) -> bool:
        """Whether this store can read `uri` (S3: any s3:// URI; local: only URIs under its root)."""
        ...

    async def put_bytes(self, key: str, data: bytes) -> str:
        """Write a whole object; returns its URI."""
        ...

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Write an object from a stream of chunks (constant memory); returns (URI, size)."""
        ...

    async def size(self, uri: str) -> int | None:
        """Size in bytes, or None when there is no such object."""
        ...

    def read(self, uri: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Stream bytes [start, end) of an object (end None: to the end). Raises ObjectNotFound."""
        ...

    async def presign_get(self, uri: str, expires_s: float) -> str:
        """A URL that GETs the object (honouring Range) until it expires."""
        ...

    async def presign_put(self, key: str, expires_s: float) -> str:
        """A URL that takes one PUT of the whole object under `key` until it expires."""
        ...

    async def delete(self, uri: str) -> None:
        ...

    async def close(self) -> None:
        ...
