"""Tables in, arrays and tables out: the SDK's submit of a DataFrame, an Arrow table, a Hugging Face
Dataset and a Parquet file, `results(task).to_numpy()`/`to_arrow()`/`to_pandas()`, the CLI's Parquet
round trip (`submit data.parquet --text-column`, `results -o out.parquet|out.npy`), README's "From a
DataFrame" block run verbatim, and what a failed task's results say. One stack (services and one
real embedding agent) serves the end-to-end part; the rest needs no services."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from minions.sample import embedding_records
from minions.sdk import (
    EmbeddingResult,
    FailedRecord,
    FailedResults,
    InputError,
    MinionsClient,
    MinionsError,
    Result,
    TableError,
)
from minions.sdk.results import embedding_matrix, result_format
from minions.sdk.tables import table_records
from minions.testing.agents import AgentFleet
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from tests.support.paths import REPO

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
N = 24


def readme_dataframe_block() -> str:
    section = (REPO / "README.md").read_text().split("### From a DataFrame", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'From a DataFrame' section has no python block"
    return match.group(1)


def test_the_readme_dataframe_block_is_ten_lines() -> None:
    assert len(readme_dataframe_block().strip().splitlines()) == 10


def test_a_bad_row_is_named_by_its_row_and_column() -> None:
    frame = pd.DataFrame({"id": ["a", "b", "c"], "body": ["one", None, "three"]})
    with pytest.raises(TableError, match=r"^row 1 \(column 'body'\): must be a string \(got null\)$"):
        list(table_records(frame, "embedding", text_column="body"))
    with pytest.raises(TableError, match=r"no column 'text' \(the table has id, body\); name the text column"):
        list(table_records(frame, "embedding"))
    with pytest.raises(TableError, match=r"^row 2 \(column 'id'\): duplicate id 1$"):
        list(table_records(pa.table({"id": [1, 2, 1], "text": ["x", "y", "z"]}), "embedding"))
    with pytest.raises(TableError, match=r"no id column 'key'"):
        list(table_records(frame, "embedding", text_column="body", id_column="key"))
    chats = pa.table({"messages": [[{"role": "user", "content": "hi"}], [{"role": "robot", "content": "hi"}]]})
    with pytest.raises(TableError, match=r"^row 1 \(column 'messages'\): messages\[0\]\.role: must be one of"):
        list(table_records(chats, "completion"))
    # No id column: the row number; a list column of a completion table is its messages.
    assert list(table_records(chats.slice(0, 1), "completion")) == [
        {"id": 0, "messages": [{"role": "user", "content": "hi"}]}]


def test_the_cli_names_a_bad_parquet_row_before_it_connects(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a", "b"], "body": ["fine", None]}), tmp_path / "bad.parquet")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MINIONS_API_URL": "http://127.0.0.1:9", "MINIONS_TOKEN": "t"}
    run = subprocess.run([sys.executable, "-m", "minions.cli.main", "submit", "bad.parquet", "--text-column", "body",
                          "--team", "search", "--project", "t", "--name", "bad", "--kind", "embedding",
                          "--model", MODEL], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == 2, run.stderr
    assert run.stderr == ("minions: bad.parquet: row 1 (column 'body'): must be a string (got null); "
                          "nothing was uploaded\n")


def test_without_pyarrow_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"need pyarrow: pip install 'minions\[data\]'"):
        list(table_records(pd.DataFrame({"text": ["a"]}), "embedding"))


def test_results_files_are_named_by_their_format() -> None:
    assert [result_format(name) for name in ("a.parquet", "b.NPY", "c.jsonl")] == [".parquet", ".npy", ".jsonl"]
    with pytest.raises(ValueError, match=r"cannot write results as '.csv' \(out.csv\): name the file .parquet"):
        result_format("out.csv")


async def test_failed_records_raise_or_come_back_as_nan_rows_and_a_mask() -> None:
    async def results() -> AsyncIterator[Result]:
        for result in (EmbeddingResult("a", [1.0, 2.0]), FailedRecord("b", "cancelled"),
                       EmbeddingResult("c", [3.0, 4.0])):
            yield result

    def nan_matrix(shape: tuple[int, int]) -> np.ndarray:  # type: ignore[type-arg]
        return np.full(shape, np.nan, dtype=np.float32)

    with pytest.raises(FailedResults, match=r'record "b" \(row 1\) failed: cancelled; to_numpy\(allow_failed=True\)'):
        await embedding_matrix(results(), 3, allow_failed=False, kind="embedding", allocate=nan_matrix)
    matrix, failed = await embedding_matrix(results(), 3, allow_failed=True, kind="embedding", allocate=nan_matrix)
    assert matrix.dtype == np.float32 and matrix.shape == (3, 2)
    assert failed is not None and failed.tolist() == [False, True, False]
    assert matrix[0].tolist() == [1.0, 2.0] and np.isnan(matrix[1]).all() and matrix[2].tolist() == [3.0, 4.0]


def _same_vectors(got: np.ndarray, want: np.ndarray) -> bool:  # type: ignore[type-arg]
    """The same embeddings in the same order: each row closest to its counterpart, nearly parallel
    (a text batched with others of other lengths embeds a little differently, so not bit for bit)."""
    if got.shape != want.shape:
        return False
    similarity = got @ want.T
    return bool((similarity.argmax(axis=1) == np.arange(len(want))).all() and similarity.diagonal().min() > 0.999)


def _frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"r{i:03d}" for i in range(n)], "body": [r["text"] for r in embedding_records(n)],
                         "stars": list(range(n))})


async def test_tables_in_arrays_out_through_real_services(services: Services, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the agent inherits it: no network for the model
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    frame = _frame(N)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "reviews.parquet")
    env = {**os.environ, "MINIONS_API_URL": services.api_url, "MINIONS_TOKEN": admin, "PYTHONPATH": str(REPO),
           "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("XDG_RUNTIME_DIR", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "minions.cli.main", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    async with MinionsClient(services.api_url, admin) as client:
        # Checked before upload, as the CLI does: nothing is uploaded, no task is made.
        with pytest.raises(InputError, match=r"record 2: text: must be a string; nothing was uploaded"):
            await client.submit([{"id": 1, "text": "a"}, {"id": 2, "text": 7}], team="search", project="t",
                                name="bad", kind="embedding", model=MODEL)
        with pytest.raises(TableError, match=r"row 1 \(column 'body'\)"):
            await client.submit(pd.DataFrame({"body": ["a", None]}), text_column="body", team="search",
                                project="t", name="bad", kind="embedding", model=MODEL)
        with pytest.raises(MinionsError) as missing:
            await client.get_task("search/t/bad")
        assert missing.value.status == 404
        assert not list((services.store_root / "inputs").rglob("*.jsonl"))

        # A failed task (an input the splitter refuses, sent raw): its results say why they are empty.
        uri = await client.upload_input(b'{"id": 1, "text": "fine"}\n{"id": 2}\n')
        await client.submit({"team": "search", "project": "t", "name": "broken", "kind": "embedding",
                             "model": MODEL, "input": {"uri": uri}})
        broken = await client.wait("search/t/broken", interval_s=0.1, timeout_s=60)
        assert broken.status == "failed" and broken.error
        empty = await asyncio.to_thread(cli, "results", "search/t/broken")
        assert empty.returncode == 1 and empty.stdout == "", empty.stderr
        assert f"task search/t/broken failed: {broken.error}" in empty.stderr
        assert "its input was never split into subtasks, so no record has a result" in empty.stderr
        assert "Traceback" not in empty.stderr

        fleet = AgentFleet(services, executor_token)
        fleet.start("tables", "--threads", "1", kinds=("embedding",))
        try:
            reversed_table = pa.Table.from_pandas(frame.iloc[::-1], preserve_index=False)
            sources = {
                "frame": (frame, {"text_column": "body"}),
                "arrow": (reversed_table, {"text_column": "body"}),
                "dataset": (datasets.Dataset.from_pandas(frame[["body"]]).rename_column("body", "text"), {}),
                "parquet": (tmp_path / "reviews.parquet", {"text_column": "body", "id_column": "id"}),
            }
            tasks = {name: await client.submit(source, team="search", project="t", name=name, kind="embedding",
                                               model=MODEL, subtask_size=7, **kwargs)  # type: ignore[arg-type]
                     for name, (source, kwargs) in sources.items()}
            submitted = await asyncio.to_thread(
                cli, "submit", "reviews.parquet", "--text-column", "body", "--team", "search", "--project", "t",
                "--name", "cli", "--kind", "embedding", "--model", MODEL, "--subtask-size", "7", "--wait")
            for task in tasks.values():
                assert (await client.wait(task, interval_s=0.2, timeout_s=240)).status == "completed"
        finally:
            fleet.stop_all()
        assert submitted.returncode == 0, f"{submitted.stdout}\n{submitted.stderr}\n{fleet.logs()}"
        assert f"{N} records" in submitted.stdout

        vectors = await client.results(tasks["frame"]).to_numpy()
        assert vectors.dtype == np.float32 and vectors.shape == (N, 384)
        typed = [r async for r in client.results("search/t/frame")]
        assert [r.id for r in typed] == list(frame["id"])  # input order, as iter_results
        assert all(isinstance(r, EmbeddingResult) and np.allclose(r.embedding, v, atol=1e-6)
                   for r, v in zip(typed, vectors, strict=True))
        # The same texts in reverse order: the same vectors, reversed.
        assert _same_vectors(await client.results(tasks["arrow"]).to_numpy(), vectors[::-1])
        assert _same_vectors(await client.results(tasks["dataset"]).to_numpy(), vectors)
        arrow = await client.results(tasks["parquet"]).to_arrow()
        assert arrow.column_names == ["id", "embedding"] and arrow.column("id").to_pylist() == list(frame["id"])
        table = await client.results(tasks["dataset"]).to_pandas()
        assert list(table["id"]) == list(range(N))  # no id column: the row numbers
        assert _same_vectors(np.stack(table["embedding"].to_list()), vectors)

        # A cancelled task: its records failed; to_numpy raises unless allow_failed (NaN rows, a mask).
        await client.submit([{"id": i, "text": "x"} for i in range(3)], team="search", project="t", name="gone",
                            kind="embedding", model=MODEL)
        await client.cancel("search", "t", "gone")
        gone = client.results("search/t/gone")
        with pytest.raises(FailedResults, match=r"record 0 \(row 0\) failed"):
            await gone.to_numpy()
        cancelled = await gone.to_numpy(allow_failed=True)
        assert cancelled.shape[0] == 3 and np.isnan(cancelled).all()
        assert gone.failed is not None and gone.failed.tolist() == [True, True, True]
        failed_table = await gone.to_arrow(allow_failed=True)
        assert failed_table.column("failed").to_pylist() == [True] * 3 and all(failed_table.column("error").to_pylist())

    # The CLI's round trip: results as Parquet and as a numpy matrix, read back.
    for output in ("out.parquet", "out.npy"):
        wrote = await asyncio.to_thread(cli, "results", "search/t/cli", "-o", output)
        assert wrote.returncode == 0 and f"wrote {N} results to {output}" in wrote.stderr, wrote.stderr
    back = pq.read_table(tmp_path / "out.parquet")
    assert back.column("id").to_pylist() == list(frame["id"])
    assert _same_vectors(np.array(back.column("embedding").to_pylist(), dtype=np.float32), vectors)
    assert _same_vectors(np.load(tmp_path / "out.npy"), vectors)
    unknown = await asyncio.to_thread(cli, "results", "search/t/cli", "-o", "out.csv")
    assert unknown.returncode == 2 and "name the file .parquet, .npy or .jsonl" in unknown.stderr
    gone_cli = await asyncio.to_thread(cli, "results", "search/t/gone", "-o", "gone.jsonl")
    # Cancelled before or after the splitter split it: either way it says no record has a result.
    assert gone_cli.returncode == 1 and re.search(
        r"minions: task search/t/gone cancelled; (.*0 of 3 records have a result|its input was never split)",
        gone_cli.stderr), gone_cli.stderr

    # README's "From a DataFrame", verbatim, in a folder holding its reviews.parquet; an agent again.
    fleet = AgentFleet(services, executor_token)
    fleet.start("readme", "--threads", "1", kinds=("embedding",))
    try:
        run = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", readme_dataframe_block()],
                                      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        fleet.stop_all()
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{fleet.logs()}"
    assert run.stdout == f"completed: {N} x 384 float32 vectors\n", run.stdout
    assert "search/reviews/reviews-1" in run.stderr  # the progress bar
