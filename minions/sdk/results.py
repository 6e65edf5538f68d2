"""A task's results as arrays and tables: `client.results(task)`.

`Results` iterates the typed records (`async for r in client.results(task)`, as `iter_results`)
and turns them into what a data pipeline holds: `to_numpy()` (a float32 matrix of the embeddings,
one row per input record, in input order), `to_arrow()`, `to_pandas()`, and `write(path)` (by
extension: `.parquet`, `.npy`, `.jsonl`). Everything is streamed from the API a batch at a time: the
matrix is filled in place (a `.npy` file is written through a memory map), the Arrow table is built
from record batches (a `.parquet` file is written batch by batch), so no result is held twice.

A failed record (its subtask failed for good, or was cancelled) raises `FailedResults` unless
`allow_failed=True`: then its row is NaN (matrix) or null (table), and `failed` (a boolean numpy
array, True where a record failed; a `failed` column next to an `error` column in a table) says
which.

numpy is a dependency of minions; pyarrow is the `data` extra, pandas the user's own.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from minions.records import format_id
from minions.sdk.objects import (
    CompletionResult,
    EmbeddingResult,
    FailedRecord,
    Result,
    SleepResult,
    Task,
    TaskRef,
    task_parts,
)
from minions.sdk.tables import DATA_EXTRA, require_pyarrow

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

Matrix = np.ndarray[Any, np.dtype[np.float32]]
Mask = np.ndarray[Any, np.dtype[np.bool_]]
ROWS_PER_BATCH = 8192
FORMATS = (".parquet", ".npy", ".jsonl")


class FailedResults(ValueError):
    """A task's results hold failed records and `allow_failed` was not given."""


def result_format(path: str | os.PathLike[str]) -> str:
    """The format a results file is written in, by its extension; ValueError for any other."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"cannot write results as {suffix or 'a file without an extension'!r} ({path}): "
                         f"name the file .parquet, .npy or .jsonl")
    return suffix


def _failed(row: int, result: FailedRecord, method: str) -> FailedResults:
    return FailedResults(f"record {format_id(result.id)} (row {row}) failed: {result.error}; "
                         f"{method}(allow_failed=True) gives the other records, failed ones marked")


class ResultSource(Protocol):
    """What `Results` reads a task's results through: MinionsClient is one. Named by its methods,
    so that this module need not import the client, which imports it."""

    async def get_task(self, ref: TaskRef) -> Task: ...

    def iter_results(self, ref: TaskRef, *, partial: bool = False) -> AsyncIterator[Result]: ...

    def results(self, team: str, project: str, name: str, /, *, partial: bool = False) -> AsyncIterator[bytes]: ...


class Results:
    """The results of one task; `async for` gives the typed records (as `iter_results`)."""

    def __init__(self, client: ResultSource, ref: TaskRef, *, partial: bool = False) -> None:
        self._client = client
        self._ref = ref
        self._partial = partial
        # After a to_* call with allow_failed: True where a record failed (a boolean array, one per row).
        self.failed: np.ndarray[Any, np.dtype[np.bool_]] | None = None

    def __aiter__(self) -> AsyncIterator[Result]:
        return self._client.iter_results(self._ref, partial=self._partial)

    async def to_numpy(self, *, allow_failed: bool = False) -> np.ndarray[Any, np.dtype[np.float32]]:
        """The embeddings as a float32 matrix, one row per input record, in input order."""
        task = await self._client.get_task(self._ref)
        matrix, self.failed = await embedding_matrix(
            aiter(self), None if self._partial else task.records_total, allow_failed=allow_failed,
            kind=task.kind, allocate=lambda shape: np.full(shape, np.nan, dtype=np.float32))
        return matrix

    async def to_arrow(self, *, allow_failed: bool = False) -> pa.Table:
        """The results as an Arrow table: `id` and the kind's columns (`embedding`, a list of float32;
        `text` and `usage`; `slept_ms`), with `failed` and `error` columns under `allow_failed`."""
        pa = require_pyarrow()
        batches = [batch async for batch in self.arrow_batches(allow_failed=allow_failed)]
        if not batches:
            return pa.table({"id": pa.array([], pa.int64())})
        return pa.concat_tables(batches)

    async def to_pandas(self, *, allow_failed: bool = False) -> pd.DataFrame:
        """The results as a pandas DataFrame (the columns of `to_arrow`); needs pandas."""
        try:
            import pandas  # noqa: F401
        except ImportError:
            raise ImportError(f"to_pandas needs pandas: {DATA_EXTRA} pandas") from None
        return (await self.to_arrow(allow_failed=allow_failed)).to_pandas()

    async def arrow_batches(self, *, allow_failed: bool = False) -> AsyncIterator[pa.Table]:
        """The results as Arrow tables of up to ROWS_PER_BATCH rows each, of one schema."""
        failed_flags: list[bool] = []
        schema = None
        builder = _Columns(allow_failed)
        row = 0
        async for result in self:
            if isinstance(result, FailedRecord) and not allow_failed:
                raise _failed(row, result, "to_arrow")
            builder.add(result)
            failed_flags.append(isinstance(result, FailedRecord))
            row += 1
            if len(builder) >= ROWS_PER_BATCH:
                table = builder.table(schema)
                schema = table.schema
                yield table
                builder = _Columns(allow_failed)
        if len(builder) or schema is None:
            yield builder.table(schema)
        self.failed = np.array(failed_flags, dtype=np.bool_) if allow_failed else None

    async def write(self, path: str | os.PathLike[str], *, allow_failed: bool = False,
                    progress: Callable[[int], None] | None = None) -> int:
        """Write the results to `path` in the format its extension names (`.parquet`, `.npy`: the
        embedding matrix, `.jsonl`: the API's lines as they are); the number of records written.
        `progress(records so far)` is told as they are written."""
        tell = progress or (lambda _rows: None)
        suffix = result_format(path)
        if suffix == ".jsonl":
            lines = 0
            out = await asyncio.to_thread(open, path, "wb")
            try:
                async for chunk in self._client.results(*task_parts(self._ref), partial=self._partial):
                    lines += chunk.count(b"\n")
                    await asyncio.to_thread(out.write, chunk)
                    tell(lines)
            finally:
                await asyncio.to_thread(out.close)
            return lines
        if suffix == ".npy":
            from numpy.lib.format import open_memmap

            task = await self._client.get_task(self._ref)

            def memmap(shape: tuple[int, int]) -> np.ndarray[Any, np.dtype[np.float32]]:
                matrix = open_memmap(os.fspath(path), mode="w+", dtype=np.float32, shape=shape)
                matrix[:] = np.nan
                return matrix

            matrix, self.failed = await embedding_matrix(
                aiter(self), None if self._partial else task.records_total, allow_failed=allow_failed,
                kind=task.kind, allocate=memmap, progress=tell)
            if isinstance(matrix, np.memmap):
                matrix.flush()
            else:  # no rows: nothing was mapped
                np.save(path, matrix)
            return int(matrix.shape[0])
        require_pyarrow()
        import pyarrow.parquet as pq

        rows = 0
        writer = None
        try:
            async for table in self.arrow_batches(allow_failed=allow_failed):
                if writer is None:
                    writer = pq.ParquetWriter(os.fspath(path), table.schema)
                await asyncio.to_thread(writer.write_table, table)
                rows += table.num_rows
                tell(rows)
        finally:
            if writer is not None:
                writer.close()
        return rows


async def embedding_matrix(results: AsyncIterator[Result], total: int | None, *, allow_failed: bool, kind: str,
                           allocate: Callable[[tuple[int, int]], Matrix],
                           progress: Callable[[int], None] | None = None) -> tuple[Matrix, Mask | None]:
    """The embeddings of `results` as a matrix `allocate`d (NaN-filled) once the dimension is known,
    with `total` rows (grown as they come when None), and the failed-rows mask under `allow_failed`."""
    if kind != "embedding":
        raise TypeError(f"to_numpy is for embedding results; this task's are {kind} (to_arrow or to_pandas)")
    failed: list[int] = []
    matrix: np.ndarray[Any, np.dtype[np.float32]] | None = None
    row = 0
    async for result in results:
        if isinstance(result, FailedRecord):
            if not allow_failed:
                raise _failed(row, result, "to_numpy")
            failed.append(row)  # its row stays NaN
        elif isinstance(result, EmbeddingResult):
            if matrix is None:
                matrix = allocate((total if total is not None else ROWS_PER_BATCH, len(result.embedding)))
            elif row >= matrix.shape[0]:
                if total is not None:
                    raise ValueError(f"the results hold more than the task's {total} records")
                grown = np.full((matrix.shape[0] * 2, matrix.shape[1]), np.nan, dtype=np.float32)
                grown[:matrix.shape[0]] = matrix
                matrix = grown
            matrix[row] = result.embedding
        else:
            raise TypeError(f"to_numpy is for embedding results, not {type(result).__name__}")
        row += 1
        if progress is not None and row % ROWS_PER_BATCH == 0:
            progress(row)
    if matrix is None:  # no embedding at all: all failed (or none)
        matrix = allocate((row, 0)) if row else np.empty((0, 0), dtype=np.float32)
    elif total is None:
        matrix = matrix[:row]
    elif row != total:
        raise ValueError(f"the results hold {row} records, the task {total}")
    if progress is not None:
        progress(row)
    mask = np.zeros(row, dtype=np.bool_)
    mask[failed] = True
    return matrix, (mask if allow_failed else None)


class _Columns:
    """One batch of results as columns, made an Arrow table of a fixed schema."""

    def __init__(self, allow_failed: bool) -> None:
        self.allow_failed = allow_failed
        self.columns: dict[str, list[Any]] = {"id": []}
        self.failed: list[bool] = []
        self.errors: list[str | None] = []

    def __len__(self) -> int:
        return len(self.columns["id"])

    def add(self, result: Result) -> None:
        row = len(self)
        self.columns["id"].append(result.id)
        values: dict[str, Any]
        if isinstance(result, EmbeddingResult):
            values = {"embedding": result.embedding}
        elif isinstance(result, CompletionResult):
            values = {"text": result.text, "usage": result.usage or None}
        elif isinstance(result, SleepResult):
            values = {"slept_ms": result.slept_ms}
        else:
            values = {}
        for name, value in values.items():
            self.columns.setdefault(name, [None] * row).append(value)
        for column in self.columns.values():
            if len(column) == row:
                column.append(None)  # a failed record's, or one without this column
        self.failed.append(isinstance(result, FailedRecord))
        self.errors.append(result.error if isinstance(result, FailedRecord) else None)

    def table(self, schema: pa.Schema | None) -> pa.Table:
        pa = require_pyarrow()
        arrays: dict[str, Any] = {}
        for name, column in self.columns.items():
            wanted = schema.field(name).type if schema is not None and name in schema.names else _type(pa, name)
            try:
                arrays[name] = pa.array(column, type=wanted)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise ValueError(f"results column {name!r} cannot be one Arrow column ({exc}); "
                                 "ids must be all integers or all strings") from None
        if self.allow_failed:
            arrays["failed"] = pa.array(self.failed, pa.bool_())
            arrays["error"] = pa.array(self.errors, pa.string())
        table = pa.table(arrays)
        if schema is not None:
            for field in schema:  # a column no record of this batch had
                if field.name not in table.column_names:
                    table = table.append_column(field, pa.nulls(table.num_rows, field.type))
            table = table.select(schema.names).cast(schema)
        return table


def _type(pa: Any, name: str) -> Any:
    return {"embedding": pa.list_(pa.float32()), "text": pa.string(), "slept_ms": pa.float64()}.get(name)
