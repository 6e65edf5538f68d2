"""Lines of a byte stream, in constant memory (one line at a time, however the chunks fall)."""

from __future__ import annotations

from collections.abc import AsyncIterator


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
