"""Tables as input: a pandas DataFrame, a pyarrow Table, a Hugging Face `datasets.Dataset` or a
`.parquet` path, read as the records of a task.

Streamed through Arrow record batches (a Parquet file's `iter_batches`, a Table's `to_batches`, a
Dataset's Arrow batches, a DataFrame a slice at a time): only one batch's two columns are ever
Python objects, and only the id and text columns are read from a Parquet file. Each record is
checked as the server will check it (minions.records), so a bad row is reported by its row number
and column before anything is uploaded.

pyarrow is the `data` extra (`pip install 'minions[data]'`), imported only when a table is given.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minions.records import DuplicateIds, find_problem, format_id
from minions.sdk.inputs import InputError

if TYPE_CHECKING:
    import pyarrow as pa

BATCH_ROWS = 8192
# A pandas DataFrame, pyarrow Table or RecordBatchReader, or a Hugging Face Dataset: typed loosely, so
# that none of those libraries is needed to import the SDK.
TableSource = Any
DATA_EXTRA = "pip install 'minions[data]'"
# The record field each kind reads, and so the column read by default.
TEXT_FIELD = {"embedding": "text", "completion": "prompt", "sleep": "ms"}


class TableError(InputError):
    """A table that cannot be read as a task's records: a missing column, a bad row."""


def require_pyarrow() -> Any:
    """The pyarrow module, or an ImportError that names the extra to install."""
    try:
        import pyarrow
    except ImportError:
        raise ImportError(f"tables, Parquet and Arrow need pyarrow: {DATA_EXTRA}") from None
    return pyarrow


def is_table(source: object) -> bool:
    """Whether `submit` reads `source` as a table: a `.parquet` path, or a DataFrame, Arrow table or
    record batch reader, or a Hugging Face Dataset (recognised by type name, so none of those
    libraries is imported here)."""
    if isinstance(source, str | os.PathLike):
        return Path(source).suffix.lower() in (".parquet", ".pq")
    return _type_name(source) in ("pandas.DataFrame", "pyarrow.Table", "pyarrow.RecordBatchReader",
                                  "datasets.Dataset")


def _type_name(source: object) -> str:
    """`pandas.DataFrame` for a DataFrame: the top package and the class, whatever submodule defines it."""
    return f"{type(source).__module__.split('.')[0]}.{type(source).__name__}"


def table_records(source: object, kind: str, *, id_column: str = "id",
                  text_column: str | None = None) -> Iterator[dict[str, Any]]:
    """The records of a table for a `kind` task, one dict at a time, each checked.

    `id_column` (default `id`): the record ids; when the table has no such column (and it was not
    asked for by name), each record's id is its row number, from 0. `text_column` (default: the
    kind's field, `text`, `prompt` or `ms`; `messages` for a completion table with that column and
    no `prompt`): what each record reads. A completion column of lists is sent as `messages`.
    Raises TableError naming the row (from 0) and column of the first bad record."""
    if kind not in TEXT_FIELD:
        raise TableError(f"unknown kind {kind!r} (one of {', '.join(TEXT_FIELD)})")
    names = _column_names(source)
    text = text_column or (
        "messages" if kind == "completion" and "prompt" not in names and "messages" in names else TEXT_FIELD[kind])
    if text not in names:
        raise TableError(f"no column {text!r} (the table has {', '.join(map(str, names)) or 'none'}); "
                         "name the text column with text_column=")
    if id_column not in names and id_column != "id":
        raise TableError(f"no id column {id_column!r} (the table has {', '.join(map(str, names))})")
    batches = _batches(source, [id_column, text])
    first = next(batches, None)
    if first is None:
        raise TableError("the table has no rows")
    pa = require_pyarrow()
    text_type = first.schema.field(text).type
    field = "messages" if kind == "completion" and (pa.types.is_list(text_type) or pa.types.is_large_list(
        text_type)) else TEXT_FIELD[kind]
    ids = DuplicateIds()
    row = 0
    for batch in itertools.chain([first], batches):
        texts = batch.column(text).to_pylist()
        record_ids: list[Any] = (batch.column(id_column).to_pylist() if id_column in names
                                 else list(range(row, row + batch.num_rows)))
        for record_id, value in zip(record_ids, texts, strict=True):
            record = {"id": record_id, field: value}
            problem = find_problem(kind, record)
            if problem is not None:
                where, reason = problem
                column = id_column if where == "id" else text if where.startswith(field) else where or text
                raise TableError(f"row {row} (column {column!r}): {_reason(where, field, reason, value)}")
            if ids.seen(record_id):
                raise TableError(f"row {row} (column {id_column!r}): duplicate id {format_id(record_id)}")
            yield record
            row += 1


def _reason(where: str, field: str, reason: str, value: object) -> str:
    """The record's problem in the table's words: the column is named already, so only a path
    inside a value (`messages[2].role`) is kept; a null cell says so."""
    if where == field:
        return f"{reason} (got {'null' if value is None else type(value).__name__})"
    return f"{where}: {reason}" if where else reason


def _column_names(source: object) -> list[str]:
    if isinstance(source, str | os.PathLike):
        require_pyarrow()
        import pyarrow.parquet as pq

        path = Path(source)
        if not path.is_file():
            raise TableError(f"no such file: {path}")
        return list(pq.ParquetFile(path).schema_arrow.names)
    table: Any = source
    kind = _type_name(source)
    if kind in ("pyarrow.Table", "pyarrow.RecordBatchReader"):
        return list(table.schema.names)
    if kind == "datasets.Dataset":
        return list(table.column_names)
    if kind == "pandas.DataFrame":
        return list(table.columns)
    raise TableError(f"not a table: {type(source).__name__}")


def _batches(source: object, wanted: list[str]) -> Iterator[pa.RecordBatch]:
    """Record batches of `source`, with only the `wanted` columns where the source can leave the others unread."""
    pa = require_pyarrow()
    if isinstance(source, str | os.PathLike):
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(Path(source))
        columns = [name for name in parquet.schema_arrow.names if name in wanted]
        yield from parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns)
        return
    kind = _type_name(source)
    if kind == "pyarrow.Table":
        yield from source.to_batches(max_chunksize=BATCH_ROWS)  # type: ignore[attr-defined]
    elif kind == "pyarrow.RecordBatchReader":
        yield from source  # type: ignore[misc]
    elif kind == "datasets.Dataset":
        # The Dataset's Arrow batches, in its row order (a shuffled or selected Dataset's too).
        for table in source.with_format("arrow").iter(batch_size=BATCH_ROWS):  # type: ignore[attr-defined]
            yield from table.to_batches()
    elif kind == "pandas.DataFrame":
        frame: Any = source
        columns = [name for name in frame.columns if name in wanted]
        for start in range(0, len(frame), BATCH_ROWS):
            # A slice at a time: the frame is never copied whole into Arrow.
            yield pa.RecordBatch.from_pandas(frame.iloc[start:start + BATCH_ROWS][columns], preserve_index=False)
    else:
        raise TableError(f"not a table: {type(source).__name__}")
