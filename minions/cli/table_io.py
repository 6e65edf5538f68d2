"""Tables on the command line: `minions submit data.parquet --text-column body` reads a Parquet file
as the task's records (minions.sdk.tables: streamed, each row checked), and `minions results TASK
-o out.parquet|out.npy|out.jsonl` writes the results in the format the extension names
(minions.sdk.results). Why a task's results are empty or incomplete is said here too."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minions import jsoncodec
from minions.sdk.results import result_format
from minions.sdk.tables import BATCH_ROWS, require_pyarrow, table_records


def parquet_as_jsonl(path: Path, kind: str, id_column: str, text_column: str | None, into: Path) -> Path:
    """The records of a Parquet file, checked row by row, as a JSONL file in `into` (what `submit`
    then checks, hashes and uploads as it does any JSONL file), with progress on stderr. TableError
    names a bad row's number (from 0) and column; ImportError names the extra that brings pyarrow."""
    require_pyarrow()  # or the ImportError that says which extra to install
    import pyarrow.parquet as pq

    show = row_progress(f"reading {path}", pq.ParquetFile(path).metadata.num_rows)
    target = into / (path.stem + ".jsonl")
    fd, spool = tempfile.mkstemp(dir=into, suffix=".part")
    rows = 0
    with os.fdopen(fd, "wb") as out:
        for record in table_records(path, kind, id_column=id_column, text_column=text_column):
            out.write(jsoncodec.dumps_line(record))
            rows += 1
            if rows % BATCH_ROWS == 0:  # a file of one batch is read at once: no progress to show
                show(rows)
    if rows > BATCH_ROWS:
        show(rows)
    os.replace(spool, target)
    return target


def row_progress(label: str, total: int | None) -> Callable[[int], None]:
    """`show(rows so far)`: a line on stderr, redrawn on a terminal at most 5 times a second, else a
    line a second; the last (rows == total) always shown."""
    last = 0.0

    def show(rows: int) -> None:
        nonlocal last
        now = time.monotonic()
        done = total is not None and rows >= total
        if now - last < (0.2 if sys.stderr.isatty() else 1.0) and not done:
            return
        last = now
        line = f"{label}: {rows:,}" + (f" of {total:,} rows ({100 * rows / max(total, 1):.0f}%)" if total else " rows")
        sys.stderr.write("\r\x1b[2K" + line + ("\n" if done else "") if sys.stderr.isatty() else line + "\n")
        sys.stderr.flush()

    return show


def output_problem(path: Path | None) -> str | None:
    """Why results cannot be written to `path` (an unknown extension), or None."""
    if path is None:
        return None
    try:
        result_format(path)
    except ValueError as exc:
        return str(exc)
    return None


def why_incomplete(task: dict[str, Any]) -> str:
    """A failed or cancelled task's results in a sentence: what ended it and what is missing."""
    records, subtasks = task["records"], task["subtasks"]
    said = f"task {task['team']}/{task['project']}/{task['name']} {task['status']}"
    if task.get("error"):
        said += f": {task['error']}"
    if not subtasks.get("total"):
        return f"{said}; its input was never split into subtasks, so no record has a result"
    ended = [f"{subtasks[k]} of its {subtasks['total']} subtasks {k}" for k in ("failed", "cancelled")
             if subtasks.get(k)]
    return "; ".join([said, *ended, f"{records['done']:,} of {records['total']:,} records have a result"])
