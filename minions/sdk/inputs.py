"""What `submit` accepts as input, made into a JSONL body that can be sent again on a retry.

A path is read from disk each time; JSONL bytes are sent as they are; an iterable of dicts is
written once, as JSONL, to a spooled temporary file (in memory up to 8 MiB, on disk past it), so a
large generator needs neither RAM nor a second pass over the caller's data. File reads and the
serialisation run in a thread: the event loop never blocks on them.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from minions import jsoncodec

InputSource = str | os.PathLike[str] | bytes | Iterable[Mapping[str, Any]]
Body = Callable[[], AsyncIterator[bytes]]

CHUNK = 1 << 20
SPOOL_IN_MEMORY = 8 << 20


class InputError(ValueError):
    """The input cannot be sent: no such file, or a record that is not a JSON object."""


async def jsonl_body(source: InputSource) -> tuple[Body, Callable[[], None]]:
    """A factory of the body's chunks (call it once per attempt) and a clean-up to call at the end."""
    if isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        return _bytes_body(data), _nothing
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not await asyncio.to_thread(path.is_file):
            raise InputError(f"no such file: {path}")
        return _file_body(lambda: path.open("rb"), close=True), _nothing
    spool = await asyncio.to_thread(_spool, source)
    return _file_body(lambda: spool, close=False), spool.close


def _bytes_body(data: bytes) -> Body:
    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(data), CHUNK):
            yield data[start:start + CHUNK]
    return chunks


def _file_body(open_file: Callable[[], IO[bytes]], *, close: bool) -> Body:
    async def chunks() -> AsyncIterator[bytes]:
        f = await asyncio.to_thread(open_file)
        try:
            await asyncio.to_thread(f.seek, 0)
            while chunk := await asyncio.to_thread(f.read, CHUNK):
                yield chunk
        finally:
            if close:
                await asyncio.to_thread(f.close)
    return chunks


def _spool(records: Iterable[Mapping[str, Any]]) -> IO[bytes]:
    spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
    try:
        for number, record in enumerate(records, 1):
            if not isinstance(record, Mapping):
                raise InputError(f"record {number} is a {type(record).__name__}, not a dict")
            spool.write(jsoncodec.dumps_line(dict(record)))
    except BaseException:
        spool.close()
        raise
    return spool


def _nothing() -> None:
    return None
