"""The local-folder object store: objects are files under one root, served to executors by the API
through signed, expiring URLs (services/api/store/url_signing.py signs them with `minions.store.signing`),
so executors see the same protocol as S3. Reading and writing here needs no key and no API address.

Every file operation runs in a worker thread (asyncio.to_thread): a slow disk must never stall the
event loop that also serves claims and heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from minions.private_files import make_private_dir, open_private
from minions.store.base import InvalidKey, ListedObject, ObjectNotFound, StoreError, check_range, validate_key

CHUNK_SIZE = 256 * 1024
# put_stream gathers small incoming chunks (aiohttp hands out a few KiB at a time) into writes of
# this size, so a large upload costs a few hundred thread hops, not tens of thousands.
WRITE_BUFFER = 1024 * 1024
# The temp file of a write in progress (_AtomicFile), or one a killed process left behind.
PARTIAL_NAME = re.compile(r"\..+\.[0-9a-f]{16}\.tmp")


class LocalObject:
    """One object opened for reading. Size and bytes come from the same file descriptor, so a
    concurrent replace of the key (os.replace swaps in a new file) never mixes two versions into
    one response, and a Content-Length computed from `size` is always honoured."""

    def __init__(self, uri: str, fh: BinaryIO, size: int) -> None:
        self.uri = uri
        self.size = size
        self._fh = fh

    async def chunks(self, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Bytes [start, end) (clamped to the object) in chunks of at most CHUNK_SIZE."""
        check_range(start, end)
        stop = self.size if end is None else min(end, self.size)
        position = start
        while position < stop:
            # pread: no shared file offset, so no seek/read pair to keep together.
            chunk = await asyncio.to_thread(os.pread, self._fh.fileno(), min(CHUNK_SIZE, stop - position),
                                            position)
            if not chunk:  # truncated under us; objects are replaced, never truncated, but never spin
                break
            position += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await asyncio.to_thread(self._fh.close)

    async def __aenter__(self) -> LocalObject:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class LocalStore:
    """Objects as files under `root` (URI `file:///abs/root`)."""

    def __init__(self, root: Path) -> None:
        # abspath, not resolve(): no filesystem access, and URIs keep the spelling the operator
        # configured (a symlinked data dir stays addressable by its configured path).
        self.root = Path(os.path.abspath(root))
        self._root_uri = self.root.as_uri().rstrip("/")

    @property
    def root_uri(self) -> str:
        return self._root_uri

    def uri_for(self, key: str) -> str:
        return f"{self._root_uri}/{validate_key(key)}"

    def key_for(self, uri: str) -> str:
        """The key of a `file://` URI under this store's root; InvalidKey otherwise (other folders,
        `..` escapes, percent-encoded escapes, query strings)."""
        parts = urlsplit(uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise InvalidKey(f"not a file:// URI of this store: {uri!r}")
        # Decode before checking, so `%2e%2e` is seen as the `..` it would become on disk.
        path = unquote(parts.path)
        prefix = str(self.root).rstrip("/") + "/"
        if not path.startswith(prefix):
            raise InvalidKey(f"{uri!r} is not under the store root {self._root_uri}")
        return validate_key(path[len(prefix):])

    def readable(self, uri: str) -> bool:
        try:
            self.key_for(uri)
        except InvalidKey:
            return False
        return True

    def path_for(self, key: str) -> Path:
        return self.root / validate_key(key)

    async def put_bytes(self, key: str, data: bytes) -> str:
        """As put_stream, in one thread hop (open, write, fsync, rename): small objects on the hot path."""
        await asyncio.to_thread(_write_whole, self.path_for(key), data)
        return self.uri_for(key)

    async def put_stream(self, key: str, chunks: AsyncIterator[bytes]) -> tuple[str, int]:
        """Write to a temporary file next to the target and os.replace it into place once complete:
        readers see the old object or the whole new one, never a prefix. A failing or cancelled
        stream leaves nothing behind."""
        path = self.path_for(key)
        writer = await asyncio.to_thread(_AtomicFile.open, path)
        size = 0
        buffer = bytearray()
        try:
            async for chunk in chunks:
                buffer += chunk
                size += len(chunk)
                if len(buffer) >= WRITE_BUFFER:
                    data = bytes(buffer)
                    buffer.clear()
                    await asyncio.to_thread(writer.write, data)
            await asyncio.to_thread(writer.commit, bytes(buffer))
        except BaseException:
            await asyncio.to_thread(writer.discard)
            raise
        return self.uri_for(key), size

    async def open(self, uri: str) -> LocalObject:
        """Open an object for reading (close it, or use it as an async context manager)."""
        path = self.path_for(self.key_for(uri))
        fh, size = await asyncio.to_thread(_open_for_read, path, uri)
        return LocalObject(uri, fh, size)

    async def size(self, uri: str) -> int | None:
        return await asyncio.to_thread(_file_size, self.path_for(self.key_for(uri)))

    async def read(self, uri: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        # An async generator: ObjectNotFound surfaces on the first iteration, as with S3.
        async with await self.open(uri) as obj:
            async for chunk in obj.chunks(start, end):
                yield chunk

    async def read_bytes(self, uri: str, start: int, end: int) -> bytes:
        check_range(start, end)
        return await asyncio.to_thread(_read_range, self.path_for(self.key_for(uri)), uri, start, end)

    async def delete(self, uri: str) -> None:
        """Remove an object; deleting a missing one is not an error (as on S3)."""
        path = self.path_for(self.key_for(uri))
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            await asyncio.to_thread(path.unlink)

    async def scan(self, prefix: str) -> AsyncIterator[ListedObject]:
        """Depth first, one folder per thread hop: a large store never blocks the event loop."""
        folders = [self.root / prefix.strip("/")] if prefix.strip("/") else [self.root]
        while folders:
            files, subfolders = await asyncio.to_thread(_scan_folder, folders.pop())
            folders.extend(subfolders)
            for path, size, modified in files:
                key = path.relative_to(self.root).as_posix()
                yield ListedObject(key, size, modified, partial=PARTIAL_NAME.fullmatch(path.name) is not None)

    async def remove(self, found: ListedObject) -> None:
        if not found.partial:
            await self.delete(self.uri_for(found.key))
            return
        path = self.path_for(found.key)  # validated: no escape from the root
        if not PARTIAL_NAME.fullmatch(path.name):
            raise InvalidKey(f"not a partial write of this store: {found.key!r}")
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(path.unlink)

    async def close(self) -> None:
        """Nothing to release: files are opened per operation."""


def _scan_folder(folder: Path) -> tuple[list[tuple[Path, int, float]], list[Path]]:
    """Regular files (path, size, mtime) and subfolders of one folder; a missing folder is empty."""
    files, folders = [], []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    folders.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    files.append((Path(entry.path), st.st_size, st.st_mtime))
    except (FileNotFoundError, NotADirectoryError):
        pass
    return files, folders


def _file_size(path: Path) -> int | None:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    # A folder (the parent of other keys) is not an object.
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def _open_for_read(path: Path, uri: str) -> tuple[BinaryIO, int]:
    try:
        fh = open(path, "rb")  # closed by LocalObject.aclose (or below, on failure)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
        raise ObjectNotFound(f"no object at {uri}") from e
    try:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ObjectNotFound(f"no object at {uri} (not a file)")
        return fh, st.st_size
    except BaseException:
        fh.close()
        raise


def _read_range(path: Path, uri: str, start: int, end: int) -> bytes:
    fh, size = _open_for_read(path, uri)
    with fh:
        return os.pread(fh.fileno(), max(0, min(end, size) - start), start) if start < size else b""


def _write_whole(path: Path, data: bytes) -> None:
    writer = _AtomicFile.open(path)
    try:
        writer.commit(data)
    except BaseException:
        writer.discard()
        raise


class _AtomicFile:
    """A temporary file in the target's folder (same filesystem, so os.replace is atomic)."""

    def __init__(self, path: Path, tmp: Path, fh: BinaryIO) -> None:
        self.path = path
        self.tmp = tmp
        self.fh = fh

    @classmethod
    def open(cls, path: Path) -> _AtomicFile:
        try:
            # Owner-only (0700 folders, 0600 files: every team's data is in here), from creation on;
            # os.replace keeps the temp file's mode for the object.
            make_private_dir(path.parent)
            # A dot-name with a random suffix: concurrent writers of one key never share a temp
            # file, and O_EXCL refuses to reuse one that somehow exists.
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
            fh = os.fdopen(open_private(tmp, os.O_WRONLY | os.O_EXCL), "wb")  # closed by commit or discard
        except OSError as e:
            raise StoreError(f"cannot write {path}: {e}") from e
        return cls(path, tmp, fh)

    def write(self, data: bytes) -> None:
        try:
            self.fh.write(data)
        except OSError as e:  # a full disk, most likely; put_stream discards the temp file
            raise StoreError(f"cannot write {self.path}: {e}") from e

    def commit(self, tail: bytes) -> None:
        try:
            self.fh.write(tail)
            self.fh.flush()
            # fsync before the rename: after a crash the key holds the old object or the whole new
            # one, never a renamed-but-empty file.
            os.fsync(self.fh.fileno())
            self.fh.close()
            os.replace(self.tmp, self.path)
        except OSError as e:
            self.discard()
            raise StoreError(f"cannot write {self.path}: {e}") from e

    def discard(self) -> None:
        self.fh.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()
