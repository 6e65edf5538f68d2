"""The splitter: cutting (pure), splitting against a real PostgreSQL and a local store, resuming,
cancelling, streaming large inputs, and the service as a real process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from minions.db.connect import connect
from minions.services.splitter.gateway import SplitterGateway
from minions.services.splitter.listener import Wakeup
from minions.services.splitter.split import split_task
from minions.services.splitter.worker import RetryBook, Worker, lost_connection
from minions.store.local import LocalStore
from minions.subtask_cutter import Cutter, IdFinder, InputError, Lines, Subtask
from minions.testing.factories import make_executor, make_token
from tests.support.paths import REPO
from tests.support.settling import task_left_to_the_splitter

# --- helpers -------------------------------------------------------------------------------------

def jsonl(*records: object) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def embedding_input(n: int, *, blank_every: int = 0) -> bytes:
    """n embedding records; with blank_every, blank and whitespace-only lines in between."""
    out = bytearray()
    for i in range(n):
        if blank_every and i % blank_every == 0:
            out += b"\n" if i % 2 else b"  \t\r\n"
        out += orjson.dumps({"id": f"r{i}", "text": f"text number {i}"}) + b"\n"
    return bytes(out)


def cut(data: bytes, kind: str, size: int, chunk: int) -> list[Subtask]:
    cutter = Cutter(kind, size)
    out: list[Subtask] = []
    for i in range(0, len(data), chunk):
        out += cutter.feed(data[i : i + chunk])
    return out + cutter.finish()


def nonblank_lines(data: bytes) -> int:
    return sum(1 for line in data.split(b"\n") if line.strip())


def assert_tiles(data: bytes, subtasks: list[Any], size: int) -> None:
    """Ranges concatenate to exactly the input, each holds exactly its records, ordinals add up."""
    rows = [s if isinstance(s, dict) else dataclasses.asdict(s) for s in subtasks]
    assert b"".join(data[s["byte_start"] : s["byte_end"]] for s in rows) == data
    position = 0
    first = 0
    for s in rows:
        assert s["byte_start"] == position
        assert s["byte_end"] > s["byte_start"]
        piece = data[s["byte_start"] : s["byte_end"]]
        assert nonblank_lines(piece) == s["records"]
        assert s["first_record"] == first
        position = s["byte_end"]
        first += s["records"]
    assert position == len(data)
    assert first == nonblank_lines(data)
    assert all(s["records"] == size for s in rows[:-1])


class ChunkedStore:
    """A LocalStore seen through small chunks, with a hook after each one and a count of bytes read."""

    def __init__(self, inner: LocalStore, chunk: int, after_chunk: Any = None) -> None:
        self.inner = inner
        self.chunk = chunk
        self.after_chunk = after_chunk
        self.bytes_read = 0
        self.chunks = 0

    def readable(self, uri: str) -> bool:
        return self.inner.readable(uri)

    async def read(self, uri: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        async for big in self.inner.read(uri, start, end):
            for i in range(0, len(big), self.chunk):
                piece = big[i : i + self.chunk]
                self.bytes_read += len(piece)
                self.chunks += 1
                yield piece
                if self.after_chunk is not None:
                    await self.after_chunk(self.chunks)


class GeneratedStore:
    """An input that exists only as it is read: `records` embedding records of ~`line_bytes` each,
    made chunk by chunk, so reading it proves nothing holds the whole input."""

    URI = "gen://big.jsonl"

    def __init__(self, records: int, line_bytes: int, per_chunk: int = 256) -> None:
        self.records = records
        self.filler = "x" * (line_bytes - 40)
        self.per_chunk = per_chunk
        self.bytes_read = 0

    def readable(self, uri: str) -> bool:
        return uri == self.URI

    async def read(self, uri: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        assert start == 0 and end is None
        for first in range(0, self.records, self.per_chunk):
            chunk = b"".join(
                orjson.dumps({"id": i, "text": self.filler}) + b"\n"
                for i in range(first, min(first + self.per_chunk, self.records))
            )
            self.bytes_read += len(chunk)
            yield chunk


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    root = tmp_path / "store"
    root.mkdir()
    return LocalStore(root)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    c = await connect(database_url)
    yield c
    await c.close()


async def put(store: LocalStore, data: bytes, key: str | None = None) -> str:
    return await store.put_bytes(key or f"inputs/{uuid.uuid4().hex}.jsonl", data)


async def insert_task(conn: asyncpg.Connection, input_uri: str, *, kind: str = "embedding",
                      subtask_size: int = 5, name: str | None = None) -> int:
    name = name or f"t-{uuid.uuid4().hex[:8]}"
    task_id: int = await conn.fetchval(
        """INSERT INTO tasks (team, project, name, kind, model, params, priority, subtask_size,
                              max_attempts, input_uri, request_hash)
           VALUES ('search', 'ranker', $1, $2, 'all-MiniLM', '{}', 0, $3, 3, $4, $5)
           RETURNING id""",
        name, kind, subtask_size, input_uri, uuid.uuid4().hex,
    )
    return task_id


async def subtasks_of(conn: asyncpg.Connection, task_id: int) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        """SELECT subtask_id, byte_start, byte_end, first_record, records, state, capability
             FROM subtasks WHERE task_id = $1 ORDER BY subtask_id""", task_id)
    return [dict(r) for r in rows]


async def task_row(conn: asyncpg.Connection, task_id: int) -> dict[str, Any]:
    row = await conn.fetchrow("SELECT * FROM tasks WHERE id = $1", task_id)
    assert row is not None
    return dict(row)


def span(subtasks: list[dict[str, Any]]) -> list[tuple[int, int, int, int, int]]:
    return [(s["subtask_id"], s["byte_start"], s["byte_end"], s["first_record"], s["records"])
            for s in subtasks]


# --- the cutter, pure ----------------------------------------------------------------------------

def test_cutter_is_independent_of_chunking() -> None:
    data = embedding_input(23, blank_every=4) + b"\n  \n"  # trailing blank lines too
    expected = cut(data, "embedding", 5, len(data))
    assert [s.records for s in expected] == [5, 5, 5, 5, 3]
    assert_tiles(data, expected, 5)
    for chunk in (1, 2, 7, 64, 1000):
        assert cut(data, "embedding", 5, chunk) == expected


def test_cutter_last_line_without_newline_and_crlf() -> None:
    data = b'{"id": 1, "ms": 5}\r\n\r\n{"id": 2, "ms": 5}\r\n{"id": 3, "ms": 5}'
    subtasks = cut(data, "sleep", 2, 3)
    assert subtasks == [Subtask(0, 42, 0, 2), Subtask(42, len(data), 2, 1)]


def test_cutter_errors_name_the_line() -> None:
    data = jsonl({"id": "a", "text": "x"}, {"id": "b", "text": "y"}) + b"\n" + jsonl({"id": "c", "text": 3})
    with pytest.raises(InputError, match=r"^line 4: text: must be a string$"):
        cut(data, "embedding", 1, 5)
    with pytest.raises(InputError, match=r"^line 2: invalid JSON: "):
        cut(b'{"id": 1, "ms": 1}\n{"id": 2,\n', "sleep", 1, 100)
    with pytest.raises(InputError, match=r"^input has no records$"):
        cut(b"\n \n\t\n", "sleep", 1, 100)
    with pytest.raises(InputError, match=r"^line 3: duplicate id \"a\"$") as info:
        data = jsonl({"id": "a", "text": ""}, {"id": 1, "text": ""}, {"id": "a", "text": ""})
        cut(data, "embedding", 1, 10)
    assert info.value.duplicate_id == "a"


def test_lines_refuse_an_endless_line() -> None:
    lines = Lines(max_line_bytes=10)
    assert list(lines.feed(b"short\n12345")) == [b"short\n"]
    with pytest.raises(InputError, match="line 2: record longer than 10 bytes"):
        list(lines.feed(b"67890123"))


def test_id_finder() -> None:
    data = b"\n" + jsonl({"id": "x", "text": ""}, {"id": "a", "text": ""}, {"id": "a", "text": ""})
    finder = IdFinder("a")
    found = any(finder.feed(data[i : i + 3]) for i in range(0, len(data), 3))
    assert found and finder.found == 3


# --- splitting against PostgreSQL ----------------------------------------------------------------

async def test_split_creates_subtasks(conn: asyncpg.Connection, store: LocalStore) -> None:
    data = embedding_input(23, blank_every=3) + b'{"id": "last", "text": "no newline"}'
    task_id = await insert_task(conn, await put(store, data), subtask_size=5)

    result = await split_task(conn, store, task_id)

    assert result.outcome == "done" and result.subtasks == 5 and result.records == 24
    subtasks = await subtasks_of(conn, task_id)
    assert [s["subtask_id"] for s in subtasks] == [0, 1, 2, 3, 4]
    assert [s["first_record"] for s in subtasks] == [0, 5, 10, 15, 20]
    assert [s["records"] for s in subtasks] == [5, 5, 5, 5, 4]
    assert_tiles(data, subtasks, 5)
    assert {s["state"] for s in subtasks} == {"pending"}
    assert {s["capability"] for s in subtasks} == {"embedding:all-MiniLM"}
    task = await task_row(conn, task_id)
    assert task["status"] == "queued" and task["split_done"]
    assert task["open_subtasks"] == 5
    assert (task["split_offset"], task["split_records"]) == (len(data), 24)
    # Splitting again is a no-op.
    assert (await split_task(conn, store, task_id)).outcome == "skipped"


async def test_subtasks_are_claimable_before_the_split_ends(conn: asyncpg.Connection, store: LocalStore,
                                                           database_url: str) -> None:
    data = embedding_input(60)
    task_id = await insert_task(conn, await put(store, data), subtask_size=2)
    seen_during_split: list[int] = []
    other = await connect(database_url)

    async def look(chunks: int) -> None:
        if chunks == 20:
            seen_during_split.append(
                await other.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1", task_id))

    try:
        slow = ChunkedStore(store, 64, look)
        result = await split_task(conn, slow, task_id, batch_subtasks=4)  # type: ignore[arg-type]
    finally:
        await other.close()
    assert result.outcome == "done" and result.subtasks == 30
    assert 0 < seen_during_split[0] < 30
    assert_tiles(data, await subtasks_of(conn, task_id), 2)


async def test_malformed_line_fails_the_task(conn: asyncpg.Connection, store: LocalStore) -> None:
    data = jsonl({"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "c", "text": 7},
                 {"id": "d", "text": "z"})
    task_id = await insert_task(conn, await put(store, data), subtask_size=1)

    result = await split_task(conn, store, task_id)

    assert result.outcome == "failed"
    task = await task_row(conn, task_id)
    assert task["status"] == "failed" and task["finished_at"] is not None
    assert task["error"] == "line 3: text: must be a string"
    assert await subtasks_of(conn, task_id) == []


async def test_bad_line_late_in_the_input_removes_inserted_subtasks(conn: asyncpg.Connection,
                                                                    store: LocalStore) -> None:
    data = embedding_input(40) + b"not json\n" + embedding_input(3)[:-1]
    task_id = await insert_task(conn, await put(store, data), subtask_size=2)
    # Small chunks and batches: several batches are in the database when line 41 is reached.
    result = await split_task(conn, ChunkedStore(store, 50), task_id,  # type: ignore[arg-type]
                              batch_subtasks=3)
    assert result.outcome == "failed"
    task = await task_row(conn, task_id)
    assert task["status"] == "failed" and task["error"].startswith("line 41: invalid JSON: ")
    assert task["open_subtasks"] == 0
    assert await subtasks_of(conn, task_id) == []


async def test_duplicate_ids_fail_with_both_lines(conn: asyncpg.Connection, store: LocalStore) -> None:
    data = jsonl({"id": "z", "text": ""}, {"id": "a1", "text": ""}) + b"\n" + jsonl(
        {"id": 3, "text": ""}, {"id": "3", "text": ""}, {"id": "b", "text": ""}, {"id": "a1", "text": ""})
    task_id = await insert_task(conn, await put(store, data), subtask_size=2)
    await split_task(conn, store, task_id)
    task = await task_row(conn, task_id)
    assert task["status"] == "failed"
    assert task["error"] == 'line 7: duplicate id "a1" (first seen on line 2)'
    assert await subtasks_of(conn, task_id) == []


@pytest.mark.parametrize("data", [b"", b"\n\n   \n"])
async def test_empty_input_fails(conn: asyncpg.Connection, store: LocalStore, data: bytes) -> None:
    task_id = await insert_task(conn, await put(store, data))
    assert (await split_task(conn, store, task_id)).outcome == "failed"
    task = await task_row(conn, task_id)
    assert task["status"] == "failed" and task["error"] == "input has no records"


async def test_missing_or_foreign_input_fails(conn: asyncpg.Connection, store: LocalStore) -> None:
    missing = store.uri_for("inputs/missing.jsonl")
    task_id = await insert_task(conn, missing)
    assert (await split_task(conn, store, task_id)).outcome == "failed"
    assert (await task_row(conn, task_id))["error"] == f"input {missing} not found"

    task_id = await insert_task(conn, "file:///etc/passwd")
    assert (await split_task(conn, store, task_id)).outcome == "failed"
    assert "not in the configured object store" in (await task_row(conn, task_id))["error"]


async def test_resumed_split_matches_an_uninterrupted_one(conn: asyncpg.Connection,
                                                          store: LocalStore) -> None:
    data = embedding_input(50, blank_every=7)
    uri = await put(store, data)
    whole = await insert_task(conn, uri, subtask_size=3)
    assert (await split_task(conn, store, whole)).outcome == "done"
    expected = await subtasks_of(conn, whole)

    # A splitter that died after its first batch of four subtasks.
    crashed = await insert_task(conn, uri, subtask_size=3)
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", crashed)
    first = expected[:4]
    assert await conn.fetchval(
        "SELECT minion_add_subtasks($1, $2, $3, $4, $5, 0, $6, $7)", crashed,
        [s["byte_start"] for s in first], [s["byte_end"] for s in first],
        [s["first_record"] for s in first], [s["records"] for s in first],
        first[-1]["byte_end"], first[-1]["first_record"] + first[-1]["records"])
    assert (await task_row(conn, crashed))["status"] == "splitting"

    result = await split_task(conn, store, crashed)

    assert result.outcome == "done" and result.subtasks == len(expected) - 4
    assert span(await subtasks_of(conn, crashed)) == span(expected)
    task = await task_row(conn, crashed)
    assert task["status"] == "queued" and task["open_subtasks"] == len(expected)


async def test_split_resumes_after_losing_its_connection_midway(conn: asyncpg.Connection, store: LocalStore,
                                                                database_url: str) -> None:
    data = embedding_input(120, blank_every=5)
    task_id = await insert_task(conn, await put(store, data), subtask_size=4)
    victim = await connect(database_url)
    pid = victim.get_server_pid()

    async def kill(chunks: int) -> None:
        if chunks == 40:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)

    try:
        with pytest.raises(Exception) as info:
            await split_task(victim, ChunkedStore(store, 64, kill), task_id,  # type: ignore[arg-type]
                             batch_subtasks=2)
        assert lost_connection(victim, info.value)
    finally:
        victim.terminate()
    task = await task_row(conn, task_id)
    assert task["status"] == "splitting" and 0 < task["split_offset"] < len(data)

    result = await split_task(conn, store, task_id)

    assert result.outcome == "done"
    subtasks = await subtasks_of(conn, task_id)
    expected = cut(data, "embedding", 4, 999)
    assert [(s.byte_start, s.byte_end, s.first_record, s.records) for s in expected] == [
        (s["byte_start"], s["byte_end"], s["first_record"], s["records"]) for s in subtasks]
    assert [s["subtask_id"] for s in subtasks] == list(range(30))


async def test_resume_still_catches_a_duplicate_of_an_already_split_record(conn: asyncpg.Connection,
                                                                           store: LocalStore) -> None:
    data = embedding_input(6) + jsonl({"id": "r1", "text": "again"})
    task_id = await insert_task(conn, await put(store, data), subtask_size=2)
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
    first = cut(embedding_input(6), "embedding", 2, 99)[:2]  # the part before the duplicate
    assert await conn.fetchval(
        "SELECT minion_add_subtasks($1, $2, $3, $4, $5, 0, $6, $7)", task_id,
        [s.byte_start for s in first], [s.byte_end for s in first], [s.first_record for s in first],
        [s.records for s in first], first[-1].byte_end, 4)
    await split_task(conn, store, task_id)
    task = await task_row(conn, task_id)
    assert task["status"] == "failed"
    assert task["error"] == 'line 7: duplicate id "r1" (first seen on line 2)'
    assert await subtasks_of(conn, task_id) == []


async def test_cancelled_task_stops_the_split(conn: asyncpg.Connection, store: LocalStore,
                                              database_url: str) -> None:
    data = embedding_input(200)
    task_id = await insert_task(conn, await put(store, data), subtask_size=2)
    other = await connect(database_url)

    async def cancel(chunks: int) -> None:
        if chunks == 10:
            await other.execute(
                "UPDATE tasks SET status = 'cancelled', finished_at = now() WHERE id = $1", task_id)

    slow = ChunkedStore(store, 64, cancel)
    try:
        result = await split_task(conn, slow, task_id, batch_subtasks=1)  # type: ignore[arg-type]
    finally:
        await other.close()
    assert result.outcome == "cancelled"
    assert slow.bytes_read < len(data) // 2  # it stopped reading, not just inserting
    assert (await task_row(conn, task_id))["status"] == "cancelled"
    assert len(await subtasks_of(conn, task_id)) < 100


async def test_large_input_streams_in_constant_memory(conn: asyncpg.Connection) -> None:
    # ~50 MB of input; a split that held the input (or a list of its subtasks) would show here.
    big = GeneratedStore(records=48_000, line_bytes=1_100)
    task_id = await insert_task(conn, GeneratedStore.URI, subtask_size=500)
    tracemalloc.start()
    try:
        result = await split_task(conn, big, task_id)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.outcome == "done" and result.subtasks == 96 and result.records == 48_000
    assert big.bytes_read > 50_000_000 and result.bytes == big.bytes_read
    # The id set (~80 bytes an id) and one chunk (~280 KB) in flight; nothing near 50 MB.
    assert peak < 12_000_000, peak


async def test_worker_skips_a_task_another_splitter_holds(conn: asyncpg.Connection, store: LocalStore,
                                                          database_url: str) -> None:
    task_id = await insert_task(conn, await put(store, embedding_input(4)), subtask_size=2)
    holder = await connect(database_url)
    worker = Worker("t", database_url, store, Wakeup(), RetryBook(1.0), sweep_interval_s=1.0)
    try:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1::bigint)", task_id)
        await worker._sweep(SplitterGateway(conn))
        assert (await task_row(conn, task_id))["status"] == "submitted"
        await holder.fetchval("SELECT pg_advisory_unlock($1::bigint)", task_id)
        await worker._sweep(SplitterGateway(conn))
        assert (await task_row(conn, task_id))["status"] == "queued"
        # ... and it let go of the lock when done.
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1::bigint)", task_id)
    finally:
        await holder.close()


def test_a_notification_naming_no_task_asks_for_a_sweep() -> None:
    wakeup = Wakeup()
    wake = wakeup.subscribe()
    wake.clear()
    wakeup.notified("7")
    wakeup.notified("3")
    assert wake.is_set() and wakeup.sweeps_asked == 0
    assert wakeup.take_named() == [3, 7] and wakeup.take_named() == []
    wakeup.notified("")  # an operator's bare NOTIFY tasks
    assert wakeup.sweeps_asked == 1 and wakeup.take_named() == []


async def test_a_worker_settles_the_tasks_named_and_sweeps_the_rest_only_when_asked(
        conn: asyncpg.Connection, store: LocalStore, database_url: str) -> None:
    """A notification costs a look at the task it names, not a sweep of every open task (sql/schema/04_tasks.sql)."""
    _, token_id = await make_token(conn, "executor")
    executor = await make_executor(conn, token_id)
    wakeup = Wakeup()
    worker = Worker("t", database_url, store, wakeup, RetryBook(3600.0), sweep_interval_s=3600.0)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(0.5)  # its first sweep, of nothing
        # Both may have ended, their closes could not tell; the earlier one comes first in a sweep.
        unnamed = await task_left_to_the_splitter(conn, executor)
        named = await task_left_to_the_splitter(conn, executor)
        wakeup.notified(str(named))
        await wait_for_status(conn, named, "completed", within_s=10)
        assert (await task_row(conn, unnamed))["status"] == "running"
        wakeup.caught_up()  # what a reconnected LISTEN asks: every open task looked at
        await wait_for_status(conn, unnamed, "completed", within_s=10)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


# --- the service as a process --------------------------------------------------------------------

async def wait_for_status(conn: asyncpg.Connection, task_id: int, status: str, within_s: float) -> float:
    """Seconds until the task reached `status`."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        if (await task_row(conn, task_id))["status"] == status:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} not {status} after {within_s}s: {await task_row(conn, task_id)}")


async def test_service_process(conn: asyncpg.Connection, store: LocalStore, database_url: str) -> None:
    before = await insert_task(conn, await put(store, embedding_input(10)), subtask_size=3)
    env = {**os.environ, "MINIONS_LOG_LEVEL": "info", "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "minions.services.splitter", "--database-url", database_url,
        "--store", store.root_uri, "--sweep-interval-s", "60",
        cwd=REPO, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    logs = asyncio.create_task(proc.stderr.read())  # drained all along, so the child never blocks
    try:
        # Catch-up on start: the task was submitted while no splitter ran.
        await wait_for_status(conn, before, "queued", within_s=30)
        assert len(await subtasks_of(conn, before)) == 4

        # Woken by NOTIFY: with a 60 s sweep interval, only the notification explains a fast split.
        during = await insert_task(conn, await put(store, embedding_input(7)), subtask_size=3)
        assert await wait_for_status(conn, during, "queued", within_s=10) < 5

        # The database drops every connection: the splitter reconnects and sweeps (the NOTIFY of a
        # task inserted while it reconnects may be lost; the sweep after reconnecting is not).
        await conn.execute("""SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                               WHERE datname = current_database() AND pid <> pg_backend_pid()""")
        after = await insert_task(conn, await put(store, embedding_input(5)), subtask_size=3)
        await wait_for_status(conn, after, "queued", within_s=15)
        assert proc.returncode is None

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        print((await logs).decode()[-4000:])  # shown when the test fails


async def test_service_rejects_missing_settings() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIONS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "minions.services.splitter", cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 2
    assert b"MINIONS_DATABASE_URL and MINIONS_STORE must be set" in err


async def test_a_split_cut_short_after_the_first_claim_resumes(database_url: str) -> None:
    """The first claim makes a task 'running' while it is still splitting; a splitter that died then
    must still find the task, and finish its split."""
    from minions.db.connect import connect

    conn = await connect(database_url)
    task_id = await conn.fetchval(
        """INSERT INTO tasks (team, project, name, kind, model, subtask_size, max_attempts, input_uri, request_hash)
           VALUES ('a', 'b', 'c', 'sleep', 'sleep', 1, 3, 'file:///x', 'h') RETURNING id""")
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
    assert await conn.fetchval("SELECT minion_add_subtasks($1, '{0}', '{10}', '{0}', '{1}', 0, 10, 1)", task_id)
    await conn.execute("UPDATE tasks SET status = 'running', started_at = now() WHERE id = $1", task_id)
    assert await SplitterGateway(conn).unsplit_tasks(limit=10) == [task_id]
    resume = await conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
    assert (resume["split_offset"], resume["split_records"], resume["next_subtask_id"]) == (10, 1, 1)
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "running"
    await conn.close()


async def test_failing_the_split_of_a_cancelled_task_keeps_its_results(database_url: str) -> None:
    from minions.db.connect import connect

    conn = await connect(database_url)
    task_id = await conn.fetchval(
        """INSERT INTO tasks (team, project, name, kind, model, subtask_size, max_attempts, input_uri, request_hash)
           VALUES ('a', 'b', 'c', 'sleep', 'sleep', 1, 3, 'file:///x', 'h') RETURNING id""")
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
    assert await conn.fetchval("SELECT minion_add_subtasks($1, '{0}', '{10}', '{0}', '{1}', 0, 10, 1)", task_id)
    await conn.execute("SELECT minion_cancel_task($1)", task_id)
    await conn.execute("SELECT minion_fail_split($1, 'line 9: bad')", task_id)
    assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1", task_id) == 1
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "cancelled"
    await conn.close()
