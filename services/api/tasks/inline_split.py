"""Small inline tasks are split at submission (sql/schema/04_tasks.sql): the cutter the splitter uses
(minions/subtask_cutter.py) over the spooled records, so the subtasks commit with the task and are
claimable at once, without the splitter's hop. Big inputs, and inputs given by URI, stay the
splitter's."""

from __future__ import annotations

from dataclasses import dataclass

from minions.services.api.tasks.inline_records import SpooledRecords
from minions.subtask_cutter import Cutter, InputError


@dataclass(frozen=True)
class SplitRanges:
    """The arguments minion_submit_task takes for the subtasks (one list per column) and, when the
    records are kept in the database (sql/schema/08_inputs.sql), the records themselves."""

    byte_starts: list[int]
    byte_ends: list[int]
    first_records: list[int]
    records: list[int]
    kept: bytes | None = None


def cut_small(records: SpooledRecords, kind: str, subtask_size: int, max_bytes: int,
              keep_up_to: int = 0) -> SplitRanges | None:
    """The subtasks of inline records no bigger than `max_bytes`, or None (the splitter's job); the
    records' bytes `kept` too when they are no bigger than `keep_up_to`. Blocking (reads the spool):
    call it in a thread unless the records are small."""
    if records.size > max_bytes:
        return None
    cutter = Cutter(kind, subtask_size)
    keep = 0 < records.size <= keep_up_to
    chunks: list[bytes] = []
    try:
        subtasks = []
        for chunk in records.chunks():
            subtasks += cutter.feed(chunk)
            if keep:
                chunks.append(chunk)
        subtasks += cutter.finish()
    except InputError:
        return None  # the splitter fails the task with its usual error
    return SplitRanges([s.byte_start for s in subtasks], [s.byte_end for s in subtasks],
                       [s.first_record for s in subtasks], [s.records for s in subtasks],
                       b"".join(chunks) if keep else None)
