"""What `minions submit` checks before it uploads anything: every record of the JSONL file (as the
splitter will), and the file's SHA-256, under which it is uploaded (same bytes, same object, so the
same command again is the same task). One streaming pass; runs in a thread."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from minions.records import DuplicateIds, format_id, parse_line

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
    ids = DuplicateIds()
    records = size = 0
    line_number = 0
    with path.open("rb") as f:
        for line in f:  # lines, however long: the splitter takes any length too
            line_number += 1
            digest.update(line)
            size += len(line)
            if not line.strip():
                continue
            record_id, problem = parse_line(kind, line)
            if problem is not None:
                raise InputProblem(f"{path} line {line_number}: {problem}")
            if ids.seen(record_id):
                raise InputProblem(f"{path} line {line_number}: duplicate id {format_id(record_id)}")
            records += 1
    if records == 0:
        raise InputProblem(f"{path}: no records (one JSON object per line)")
    return CheckedInput(digest.hexdigest(), records, size)
