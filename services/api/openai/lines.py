"""Lines of a byte stream, in constant memory (one line at a time, however the chunks fall)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


async def lines_of(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Every line of the stream without its newline, blank ones included (line numbers count them);
    a last line without a newline too."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        if b"\n" not in chunk:
            continue
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line
    if buffer:
        yield buffer


async def batched(lines: AsyncIterator[bytes], size: int = 1 << 20) -> AsyncIterator[bytes]:
    """JSONL lines (newline included) gathered into chunks of about `size` bytes, for the store."""
    parts: list[bytes] = []
    held = 0
    async for line in lines:
        parts.append(line)
        held += len(line)
        if held >= size:
            yield b"".join(parts)
            parts, held = [], 0
    if parts:
        yield b"".join(parts)


@dataclass(frozen=True)
class Overlong:
    """A line longer than the limit, in place of its bytes (which were never held)."""
    length: int


async def bounded_lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes | Overlong]:
    """`lines_of`, but a line over `limit` bytes is skipped as it streams and given as Overlong: no
    more than `limit` bytes of a line (and one chunk) are ever held."""
    parts: list[bytes] = []
    held = 0
    skipped = -1  # bytes of an overlong line skipped so far (-1: not skipping)
    async for chunk in chunks:
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if skipped >= 0:
                skipped += len(piece)
            elif held + len(piece) > limit:
                skipped, parts, held = held + len(piece), [], 0
            else:
                parts.append(piece)
                held += len(piece)
            if end < 0:
                break
            if skipped >= 0:
                yield Overlong(skipped)
            else:
                yield b"".join(parts)
            parts, held, skipped = [], 0, -1
            start = end + 1
    if skipped >= 0:
        yield Overlong(skipped)
    elif held:
        yield b"".join(parts)
