"""The one object-store interface. Two implementations: S3 (aioboto3, presigned URLs) and a local
folder served by the API through signed, expiring URLs. Executors only ever see URLs.

Objects are named by URI (`s3://bucket/key`, `file:///abs/path`); the store writes new objects
under its own root by *key* (`inputs/…`, `outputs/…`)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

# Keys become file paths (local store) and URL paths (signed URLs) verbatim, so the alphabet is
# kept to characters that need no quoting anywhere and cannot name a parent folder.
_KEY_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
MAX_KEY_LENGTH = 1024  # S3's own limit on key length


class StoreError(Exception):
    """An object-store operation failed (the message says which object and why)."""


class ObjectNotFound(StoreError):
    pass


class InvalidKey(StoreError, ValueError):
    """A key or URI that no store may use (a ValueError too: it is the caller's mistake)."""


def validate_key(key: str) -> str:
    """Return `key` if it is a safe relative object key, else raise InvalidKey: `/`-separated
    segments of `[A-Za-z0-9._-]`, no empty, `.` or `..` segment (so no absolute paths, no escapes
    from a store's root), at most 1024 characters."""
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(f"object key must be 1-{MAX_KEY_LENGTH} characters: {key[:80]!r}")
    for segment in key.split("/"):
        if segment in ("", ".", "..") or not _KEY_SEGMENT.fullmatch(segment):
            raise InvalidKey(f"invalid object key {key!r}: segments of [A-Za-z0-9._-], no '.' or '..'")
    return key


def check_range(start: int, end: int | None) -> None:
    """Raise ValueError unless [start, end) is a byte range (end None: to the object's end); every
    store, and what reads through one, refuses a bad range with this one message."""
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"bad byte range [{start}, {end})")


@dataclass(frozen=True)
class ListedObject:
    """One thing found under a store prefix, for the garbage collector."""

    key: str  # relative to the store's root; for a partial write, its temp file's path
    size: int  # bytes (0 when unknown: an S3 multipart upload)
    modified: float  # unix seconds of the last write (an S3 multipart upload: when it began)
    partial: bool = False  # an unfinished write: a local temp file, an S3 multipart upload
    upload_id: str = ""  # S3 multipart upload id


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

    async def read_bytes(self, uri: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object in one piece (one request, one thread hop): for small
        ranges, the hot path's inline inputs. Raises ObjectNotFound."""
        ...

    async def delete(self, uri: str) -> None:
        ...

    def scan(self, prefix: str) -> AsyncIterator[ListedObject]:
        """Every object and partial write under `prefix` (a key prefix ending in '/')."""
        ...

    async def remove(self, found: ListedObject) -> None:
        """Delete what `scan` found: an object, or a partial write (temp file, multipart upload)."""
        ...

    async def close(self) -> None:
        ...
