"""Compacted results with real services, a real PostgreSQL and the real local store:
parts concatenate to the per-subtask results in order; a compaction killed with SIGKILL resumes and
loses nothing; a tampered part is an error on every read path; gc keeps what parts need and removes
per-subtask objects only once parts are recorded; cancelled tasks keep their results."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from minions.db.connect import connect
from minions.sdk import MinionsClient
from minions.sdk.parts import PartCorrupted
from minions.testing.factories import make_tokens
from minions.testing.processes import IMPORT_ROOT, Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually


@pytest.fixture
async def cluster(services: Services, request: pytest.FixtureRequest) -> AsyncIterator[tuple[Services, MinionsClient]]:
    """API and splitter (no watchdog: the tests compact when they choose), two sleep executors; they
    PUT their outputs, or carry them inline when the test says so (`indirect` parameter True)."""
    inline = bool(getattr(request, "param", False))
    services.workdir.mkdir(parents=True, exist_ok=True)
    services.start("api")
    services.start("splitter")
    await services.wait_healthy()
    admin, executor_token = await make_tokens(services.database_url)
    stop = asyncio.Event()
    runners = [asyncio.create_task(SleepExecutor(services.api_url, executor_token, f"parts-{i}",
                                                 inline_output=inline).run(stop))
               for i in range(2)]
    client = MinionsClient(services.api_url, admin)
    try:
        yield services, client
    finally:
        stop.set()
        await asyncio.gather(*runners, return_exceptions=True)
        await client.close()


async def _run_task(client: MinionsClient, name: str, records: int, subtask_size: int = 1) -> int:
    await client.submit({"team": "search", "project": "parts", "name": name, "kind": "sleep",
                         "subtask_size": subtask_size,
                         "input": {"records": [{"id": f"{name}-{i:05d}", "ms": 0} for i in range(records)]}})

    async def ended() -> dict[str, object] | None:
        task = await client.task("search", "parts", name)
        return task if task["status"] in ("completed", "failed", "cancelled") else None

    task = await eventually(ended, f"task {name} ends", 120)
    assert task["status"] == "completed", task
    return await _task_id(os.environ["MINIONS_TEST_PARTS_DB"], name)


async def _task_id(url: str, name: str) -> int:
    conn = await connect(url)
    try:
        task_id: int = await conn.fetchval("SELECT id FROM tasks WHERE name = $1", name)
        return task_id
    finally:
        await conn.close()


async def _stream(services: Services, client: MinionsClient, name: str) -> tuple[bytes, bool]:
    """The API's JSONL stream: (bytes, whether it ended cleanly)."""
    received = bytearray()
    url = f"{services.api_url}/api/v1/tasks/search/parts/{name}/results"
    async with aiohttp.ClientSession() as session, session.get(url, headers=client._headers) as resp:
        assert resp.status == 200
        try:
            async for chunk in resp.content.iter_any():
                received += chunk
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
            return bytes(received), False
    return bytes(received), True


async def _sdk(client: MinionsClient, name: str) -> bytes:
    return b"".join([chunk async for chunk in client.results("search", "parts", name)])


def _minions(services: Services, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "MINIONS_DATABASE_URL": services.database_url, "PYTHONPATH": str(IMPORT_ROOT),
           "MINIONS_STORE": services.store_root.as_uri(), "MINIONS_GC_GRACE_S": "0"}
    return subprocess.Popen([sys.executable, "-m", "minions.cli.main", *args], env=env, cwd=IMPORT_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


async def _rows(url: str, query: str, *args: object) -> list[dict[str, object]]:
    conn = await connect(url)
    try:
        return [dict(r) for r in await conn.fetch(query, *args)]
    finally:
        await conn.close()


def _files(root: Path, prefix: str) -> list[Path]:
    folder = root / prefix
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


@pytest.fixture(autouse=True)
def _db_env(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIONS_TEST_PARTS_DB", database_url)


async def test_parts_concatenate_to_the_results_and_gc_keeps_what_they_need(
        cluster: tuple[Services, MinionsClient], tmp_path: Path) -> None:
    services, client = cluster
    task_id = await _run_task(client, "whole", 60, subtask_size=2)
    before, clean = await _stream(services, client, "whole")
    assert clean and before.count(b"\n") == 60
    listing = await client.result_parts("search", "parts", "whole")
    assert listing == {"compacted": False, "expires_in_s": 3600, "records": 0, "bytes": 0, "parts": []}

    # gc before compaction: every per-subtask result is still what results are read from.
    results_before = _files(services.store_root, "results")
    assert len(results_before) == 30
    _finish(_minions(services, "gc"))
    assert _files(services.store_root, "results") == results_before

    _finish(_minions(services, "compact", "--result-part-bytes", "700"))
    parts = await _rows(services.database_url, "SELECT * FROM result_parts WHERE task_id = $1 ORDER BY part",
                        task_id)
    assert len(parts) >= 3
    assert [p["first_subtask"] for p in parts] == [0] + [p["last_subtask"] + 1 for p in parts[:-1]]
    assert parts[-1]["last_subtask"] == 29 and sum(p["records"] for p in parts) == 60
    # The parts' bytes, in order, are the per-subtask results, in order.
    stored = b"".join((services.store_root / str(p["key"])).read_bytes() for p in parts)
    assert stored == before

    # Every read path serves the same bytes: the stream (now from parts), the SDK (presigned GETs
    # straight to the store, checked), the CLI.
    assert await _stream(services, client, "whole") == (before, True)
    listing = await client.result_parts("search", "parts", "whole")
    assert listing is not None and listing["compacted"] and len(listing["parts"]) == len(parts)
    assert all("/api/v1/store/parts/" in p["url"] for p in listing["parts"])
    assert await _sdk(client, "whole") == before
    out = tmp_path / "cli.jsonl"
    command = [sys.executable, "-m", "minions.cli.main", "results", "search/parts/whole", "-o", str(out),
               "--api-url", services.api_url, "--token", client._headers["Authorization"][7:]]
    proc = await asyncio.to_thread(subprocess.run, command, cwd=IMPORT_ROOT, capture_output=True, text=True,
                                   env={**os.environ, "PYTHONPATH": str(IMPORT_ROOT)}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == before and "wrote 60 results" in proc.stderr

    # Once parts are recorded, gc removes the per-subtask objects and keeps the parts.
    _finish(_minions(services, "gc"))
    assert _files(services.store_root, "results") == []
    assert len(_files(services.store_root, "parts")) == len(parts)
    assert await _stream(services, client, "whole") == (before, True)
    assert await _sdk(client, "whole") == before


@pytest.mark.parametrize("cluster", [True], indirect=True, ids=["inline-outputs"])
async def test_results_kept_in_the_database_compact_and_gc_drops_them_only_after(
        cluster: tuple[Services, MinionsClient]) -> None:
    """Small inline outputs are committed in their rows (sql/schema/07_results.sql), no result object. Results are read
    from the rows; gc leaves them while the task is not compacted; compaction copies the same bytes
    into parts; then gc drops the rows' bytes (grace 0 here) and results are served from the parts."""
    services, client = cluster
    task_id = await _run_task(client, "kept", 40, subtask_size=2)
    before, clean = await _stream(services, client, "kept")
    assert clean and before.count(b"\n") == 40
    assert _files(services.store_root, "results") == []
    kept = "SELECT count(*) AS n FROM subtasks WHERE task_id = $1 AND result_data IS NOT NULL AND result_key IS NULL"
    assert (await _rows(services.database_url, kept, task_id))[0]["n"] == 20

    assert "kept in the database" not in _finish(_minions(services, "gc"))
    assert (await _rows(services.database_url, kept, task_id))[0]["n"] == 20

    _finish(_minions(services, "compact", "--result-part-bytes", "300"))
    parts = await _rows(services.database_url, "SELECT key FROM result_parts WHERE task_id = $1 ORDER BY part",
                        task_id)
    assert len(parts) >= 3
    assert b"".join((services.store_root / str(p["key"])).read_bytes() for p in parts) == before

    assert "dropped 20 compacted results kept in the database" in _finish(_minions(services, "gc"))
    assert (await _rows(services.database_url, kept, task_id))[0]["n"] == 0
    recorded = "SELECT count(*) AS n FROM subtasks WHERE task_id = $1 AND result_sha256 IS NOT NULL"
    assert (await _rows(services.database_url, recorded, task_id))[0]["n"] == 20
    assert await _stream(services, client, "kept") == (before, True)
    assert await _sdk(client, "kept") == before


async def test_a_compaction_killed_mid_way_resumes_and_loses_nothing(
        cluster: tuple[Services, MinionsClient]) -> None:
    services, client = cluster
    task_id = await _run_task(client, "killed", 400, subtask_size=1)
    before, _ = await _stream(services, client, "killed")
    count = "SELECT count(*) AS n FROM result_parts WHERE task_id = $1"

    # One subtask per part: hundreds of write-then-record steps, so the kill lands between some.
    proc = _minions(services, "compact", "--result-part-bytes", "1")

    async def some_parts() -> int | None:
        n = int((await _rows(services.database_url, count, task_id))[0]["n"])  # type: ignore[call-overload]
        return n if n >= 5 else None

    await eventually(some_parts, "the first parts recorded", 60)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    recorded = int((await _rows(services.database_url, count, task_id))[0]["n"])  # type: ignore[call-overload]
    compacted = await _rows(services.database_url, "SELECT * FROM compacted_tasks WHERE task_id = $1", task_id)
    assert compacted == [] and recorded < 400, "the kill came after the end: the drill proved nothing"
    # Until the compaction ends, results come from the per-subtask objects, which gc keeps.
    _finish(_minions(services, "gc"))
    assert len(_files(services.store_root, "results")) == 400
    assert await _stream(services, client, "killed") == (before, True)

    out = _finish(_minions(services, "compact", "--result-part-bytes", "1"))
    assert f"task {task_id}: compacted" in out
    parts = await _rows(services.database_url, "SELECT * FROM result_parts WHERE task_id = $1 ORDER BY part",
                        task_id)
    assert [p["first_subtask"] for p in parts] == list(range(400))
    assert b"".join((services.store_root / str(p["key"])).read_bytes() for p in parts) == before
    # A part the killed process wrote but never recorded is garbage; the recorded ones are kept.
    _finish(_minions(services, "gc"))
    assert {str(p.relative_to(services.store_root)) for p in _files(services.store_root, "parts")} == \
        {str(p["key"]) for p in parts}
    assert await _sdk(client, "killed") == before
    # Idempotent: compacting again changes nothing.
    _finish(_minions(services, "compact", "--task-id", str(task_id)))
    assert len(await _rows(services.database_url, "SELECT 1 FROM result_parts WHERE task_id = $1", task_id)) == 400


async def test_a_tampered_part_is_an_error_on_every_read(cluster: tuple[Services, MinionsClient]) -> None:
    services, client = cluster
    task_id = await _run_task(client, "tampered", 20, subtask_size=2)
    before, _ = await _stream(services, client, "tampered")
    _finish(_minions(services, "compact", "--result-part-bytes", "400"))
    parts = await _rows(services.database_url, "SELECT key FROM result_parts WHERE task_id = $1 ORDER BY part",
                        task_id)
    victim = services.store_root / str(parts[-1]["key"])
    original = victim.read_bytes()
    victim.write_bytes(original.replace(b"tampered-000", b"tampered-999", 1) if b"tampered-000" in original
                       else original[:-2] + b"X\n")
    received, clean = await _stream(services, client, "tampered")
    assert not clean and before.startswith(received) and len(received) < len(before)
    with pytest.raises(PartCorrupted):
        await _sdk(client, "tampered")
    victim.write_bytes(original[:-1])  # truncated
    with pytest.raises(PartCorrupted):
        await _sdk(client, "tampered")
    victim.write_bytes(original)
    assert await _sdk(client, "tampered") == before


async def test_results_of_a_cancelled_task_still_work_and_it_is_not_compacted(
        cluster: tuple[Services, MinionsClient]) -> None:
    services, client = cluster
    await client.submit({"team": "search", "project": "parts", "name": "stopped", "kind": "sleep",
                         "subtask_size": 1,
                         "input": {"records": [{"id": f"s{i:04d}", "ms": 200} for i in range(40)]}})
    await asyncio.sleep(0.5)
    await client.cancel("search", "parts", "stopped")
    _finish(_minions(services, "compact"))
    task_id = await _task_id(services.database_url, "stopped")
    assert await _rows(services.database_url, "SELECT 1 FROM result_parts WHERE task_id = $1", task_id) == []
    listing = await client.result_parts("search", "parts", "stopped")
    assert listing is not None and not listing["compacted"]
    lines = (await _sdk(client, "stopped")).splitlines()
    assert [line.split(b'"')[3] for line in lines] == [f"s{i:04d}".encode() for i in range(40)]
    assert any(b"task cancelled" in line for line in lines)


async def test_the_watchdog_compacts_a_completed_task_on_its_own(cluster: tuple[Services, MinionsClient]) -> None:
    services, client = cluster
    task_id = await _run_task(client, "watched", 30, subtask_size=3)
    before, _ = await _stream(services, client, "watched")
    services.extra_env["MINIONS_COMPACT_INTERVAL_S"] = "0.2"
    services.start("watchdog")

    async def compacted() -> list[dict[str, object]] | None:
        rows = await _rows(services.database_url, "SELECT * FROM compacted_tasks WHERE task_id = $1", task_id)
        return rows or None

    rows = await eventually(compacted, "the watchdog compacts the task", 60)
    assert rows[0]["parts"] == 1 and rows[0]["bytes"] == len(before)
    assert await _sdk(client, "watched") == before
