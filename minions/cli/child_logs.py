"""Where the output of a child of `minions up` goes: a log file per child that rotates by size
(stdlib `RotatingFileHandler`: `api.log`, then `api.log.1` … `api.log.N`, oldest dropped), so a
pool left running for weeks never fills the disk. The child writes into a pipe; `pump` copies it
line by line into the file, which is owner-only like the data dir around it (logs name tasks,
teams and errors)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
from logging.handlers import RotatingFileHandler
from pathlib import Path

from minions.private_files import open_private

MAX_BYTES = 10 * 1024 * 1024  # one file; with BACKUPS, at most ~60 MiB of log per child
BACKUPS = 5
CHUNK = 1 << 16


class ChildLog(RotatingFileHandler):
    """One child's log file, rotated at `max_bytes`, its backups kept `backups` deep."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, backups: int = BACKUPS) -> None:
        super().__init__(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
        self.setFormatter(logging.Formatter("%(message)s"))

    def _open(self) -> io.TextIOWrapper:
        # Owner-only from the first byte (open_private), not the umask's default.
        fd = open_private(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND)
        return open(fd, "a", encoding="utf-8", errors="replace")  # the handler closes it

    def write_line(self, line: str) -> None:
        self.emit(logging.makeLogRecord({"msg": line, "args": None}))


async def pump(stream: asyncio.StreamReader, log: ChildLog) -> None:
    """Copy a child's output into its log until the child closes it: whole lines, however long
    (a line longer than a chunk is joined first), and a last line without a newline too."""
    pending = b""
    while chunk := await stream.read(CHUNK):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            log.write_line(line.decode("utf-8", errors="replace"))
    if pending:
        log.write_line(pending.decode("utf-8", errors="replace"))
    log.flush()
