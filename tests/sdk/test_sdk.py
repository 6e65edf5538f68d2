"""The Python SDK against real services: where it connects, what submit takes, typed results in
input order, the synchronous facade, and retries that wait as long as the server's Retry-After."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest

from minions import jsoncodec
from minions.db.migrate import migrate
from minions.embedded_pg import EmbeddedPostgres
from minions.sdk import FailedRecord, InputError, MinionsClient, MinionsError, SleepResult, SyncMinionsClient, Task
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor


@pytest.fixture
def no_minions_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("MINIONS_API_URL", "MINIONS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # no other `minions up` is found
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_from_env_takes_the_environment_first_then_the_up_json_of_minions_up(
        no_minions_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = no_minions_env / ".minions"  # where `minions up` run here keeps its state
    data_dir.mkdir()
    (data_dir / "up.json").write_bytes(jsoncodec.dumps({"api_url": "http://127.0.0.1:9999",
                                                        "admin_token": "mn_from_up_json"}))
    client = MinionsClient.from_env()
    assert client.api_url == "http://127.0.0.1:9999"
    assert client._headers["Authorization"] == "Bearer mn_from_up_json"
    monkeypatch.setenv("MINIONS_API_URL", "http://api.example:8080/")
    monkeypatch.setenv("MINIONS_TOKEN", "mn_from_env")
    client = MinionsClient.from_env()
    assert client.api_url == "http://api.example:8080"
    assert client._headers["Authorization"] == "Bearer mn_from_env"


@pytest.fixture
async def sleep_cluster(services: Services) -> AsyncIterator[tuple[Services, str]]:
    """Services and one test executor of the `sleep` kind; an admin token."""
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    stop = asyncio.Event()
    runner = asyncio.create_task(SleepExecutor(services.api_url, executor_token, "sdk-test").run(stop))
    try:
        yield services, admin
    finally:
        stop.set()
        await asyncio.gather(runner, return_exceptions=True)


def _records(prefix: str, n: int) -> list[dict[str, object]]:
    return [{"id": f"{prefix}{i:03d}", "ms": 1} for i in range(n)]


async def test_submit_a_path_bytes_or_dicts_and_read_typed_results_in_order(
        sleep_cluster: tuple[Services, str], tmp_path: Path) -> None:
    services, admin = sleep_cluster
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(jsoncodec.dumps_line(r) for r in _records("p", 30)))
    inputs = {
        "from-path": (path, _records("p", 30)),
        "from-bytes": (b"".join(jsoncodec.dumps_line(r) for r in _records("b", 25)), _records("b", 25)),
        "from-dicts": ((r for r in _records("d", 40)), _records("d", 40)),  # a generator: read once
    }
    async with MinionsClient(services.api_url, admin) as client:
        for name, (source, records) in inputs.items():
            submitted = await client.submit(source, team="search", project="sdk", name=name, kind="sleep",
                                            subtask_size=7)
            assert isinstance(submitted, Task) and submitted.ref == f"search/sdk/{name}"
            task = await client.wait(submitted, progress=True, interval_s=0.1, timeout_s=60)
            assert task.status == "completed" and task.records_done == len(records) == task.records_total
            assert isinstance(task.finished_at, datetime) and task.duration_s is not None
            results = [r async for r in client.iter_results(task)]
            assert results == [SleepResult(r["id"], 1) for r in records]  # type: ignore[arg-type]


async def test_the_sync_facade_and_failed_records(sleep_cluster: tuple[Services, str]) -> None:
    services, admin = sleep_cluster

    def script() -> tuple[Task, list[object]]:  # what a notebook does, in a thread of its own
        with SyncMinionsClient(services.api_url, admin) as minions:
            task = minions.submit([{"id": 1, "ms": 1}, {"id": 2, "ms": 1}], team="search", project="sdk",
                                  name="sync", kind="sleep")
            task = minions.wait(task.ref, timeout_s=60)
            return task, list(minions.iter_results(task))

    task, results = await asyncio.to_thread(script)
    assert task.status == "completed" and results == [SleepResult(1, 1), SleepResult(2, 1)]
    assert FailedRecord(1, "x").ok is False and results[0].ok  # type: ignore[attr-defined]


@pytest.fixture
def own_postgres() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, which it stops and starts."""
    root = Path(tempfile.mkdtemp(prefix="minions-sdk-pg-"))
    pg = EmbeddedPostgres(root / "pgdata", fast=True)
    pg.start()
    try:
        yield pg
    finally:
        try:
            pg.stop("immediate")
        finally:
            shutil.rmtree(root, ignore_errors=True)


async def test_a_503_is_retried_after_the_servers_retry_after(own_postgres: EmbeddedPostgres,
                                                              tmp_path: Path) -> None:
    await migrate(own_postgres.url)
    services = Services(own_postgres.url, tmp_path / "services")
    await services.start_all()
    try:
        admin, _ = await make_tokens(own_postgres.url)
        async with MinionsClient(services.api_url, admin, retries=60) as client:  # PG may start slowly here
            assert (await client.tasks())["tasks"] == []
            await asyncio.to_thread(own_postgres.stop, "immediate")
            listing = asyncio.create_task(client.tasks(project="outage"))
            await asyncio.sleep(5)  # the API answers 503 database_unavailable, Retry-After: 2, meanwhile
            assert not listing.done()
            await asyncio.to_thread(own_postgres.start)
            assert (await asyncio.wait_for(listing, 60))["tasks"] == []
    finally:
        services.stop_all()
    attempts = [e for e in (jsoncodec.loads(line) for line in services.running["api"].log().splitlines()
                            if line.startswith("{"))
                if e["event"] == "http_request" and e["path"] == "/api/v1/tasks?project=outage&limit=50"]
    assert [a["status"] for a in attempts][:2] == [503, 503] and attempts[-1]["status"] == 200, attempts
    times = [datetime.fromisoformat(a["timestamp"]) for a in attempts]
    gaps = [(b - a).total_seconds() for a, b in pairwise(times)]
    assert all(gap >= 1.9 for gap in gaps), gaps  # the API said Retry-After: 2; the backoff alone is shorter


async def test_submit_replace_takes_the_name_from_a_task_that_runs_and_its_results_go(
        sleep_cluster: tuple[Services, str]) -> None:
    services, admin = sleep_cluster
    async with MinionsClient(services.api_url, admin) as client:
        old = await client.submit([{"id": i, "ms": 100} for i in range(10)], team="search", project="sdk",
                                  name="again", kind="sleep", subtask_size=1)
        with pytest.raises(MinionsError) as taken:
            await client.submit(_records("n", 3), team="search", project="sdk", name="again", kind="sleep")
        assert taken.value.code == "task_exists"
        # A bad record is refused before anything happens to the old task.
        with pytest.raises(InputError):
            await client.submit([{"id": 1}], team="search", project="sdk", name="again", kind="sleep", replace=True)
        assert (await client.get_task(old.ref)).input_uri == old.input_uri

        new = await client.submit(_records("n", 3), team="search", project="sdk", name="again", kind="sleep",
                                  replace=True)
        assert new.input_uri != old.input_uri and new.created_at != old.created_at
        task = await client.wait(new, interval_s=0.1, timeout_s=60)
        assert task.status == "completed"
        assert [r async for r in client.iter_results(task)] == [SleepResult(r["id"], 1) for r in _records("n", 3)]  # type: ignore[arg-type]
        # Nothing to replace: the same as a plain submit.
        fresh = await client.submit(_records("f", 1), team="search", project="sdk", name="fresh", kind="sleep",
                                    replace=True)
        assert fresh.ref == "search/sdk/fresh"
