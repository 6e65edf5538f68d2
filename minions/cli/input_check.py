"""What `minions submit` checks before it uploads anything: every record of the JSONL file (as the
splitter will), and the file's SHA-256, under which it is uploaded (same bytes, same object, so the
same command again is the same task). One streaming pass; runs in a thread."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from minions.records import RecordProblem, check_lines

CHUNK = 1 << 20


class InputProblem(ValueError):
    """A record the server would reject; the message names the file and line."""


@dataclass(frozen=True)
class CheckedInput:
    sha256: str
    records: int
    size: int


def check_input(path: Path, kind: str) -> CheckedInput:
    digest = hashlib.sha256()
    size = 0

    def hashed(f: IO[bytes]) -> Iterator[bytes]:
        nonlocal size
        for line in f:  # lines, however long: the splitter takes any length too
            digest.update(line)
            size += len(line)
            yield line

    with path.open("rb") as f:
        try:
            records = check_lines(hashed(f), kind, str(path))
        except RecordProblem as exc:
            raise InputProblem(str(exc)) from None
    return CheckedInput(digest.hexdigest(), records, size)
