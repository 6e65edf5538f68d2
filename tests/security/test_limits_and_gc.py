"""Size limits and garbage. POST /inputs and output PUTs are capped (413 with the
limit), a team's stored input bytes have a quota, and `minions gc` / the watchdog's sweep return
the space of unreferenced uploads, outputs of deleted tasks and dead attempts, and the partial
writes of an API killed mid-upload (real processes, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import yarl

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.processes import IMPORT_ROOT, Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually
from tests.support.s3 import FAKE_ENV, moto_server
from tests.support.tenants import tenant_tokens

LIMIT = 1_000_000



async def _call(url: str, token: str | None, method: str, *, json: Any = None, data: Any = None,
                content_type: str = "application/x-ndjson") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if data is not None:
        headers["Content-Type"] = content_type
    async with aiohttp.ClientSession() as session, session.request(
            method, yarl.URL(url, encoded=True), json=json, data=data, headers=headers) as resp:
        raw = await resp.read()
        return resp.status, jsoncodec.loads(raw) if raw and resp.content_type == "application/json" else raw


def _jsonl(size: int) -> bytes:
    """Valid sleep records, about `size` bytes."""
    lines, total, i = [], 0, 0
    while total < size:
        line = jsoncodec.dumps_line({"id": f"r{i:08d}", "ms": 0})
        lines.append(line)
        total += len(line)
        i += 1
    return b"".join(lines)


async def _chunked(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 65536):
        yield data[i:i + 65536]


def _exists(uri: str) -> bool:
    return Path(uri.removeprefix("file://")).exists()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


async def _api_only(database_url: str, tmp_path: Path, **env: str) -> Services:
    services = Services(database_url, tmp_path / "services", extra_env=env)
    services.workdir.mkdir(parents=True)
    services.start("api")
    await services.wait_healthy()
    return services


def _minions(services: Services, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MINIONS_DATABASE_URL": services.database_url, "PYTHONPATH": str(IMPORT_ROOT),
           "MINIONS_STORE": services.store_root.as_uri(), **(env or {})}
    return subprocess.run([sys.executable, "-m", "minions.cli.main", *args], env=env, cwd=IMPORT_ROOT,
                          capture_output=True, text=True, timeout=120)


async def test_inputs_and_outputs_over_their_cap_are_413_and_leave_nothing(database_url: str,
                                                                           tmp_path: Path) -> None:
    services = await _api_only(database_url, tmp_path, MINIONS_MAX_INPUT_BYTES=str(LIMIT),
                               MINIONS_MAX_OUTPUT_BYTES=str(LIMIT))
    tokens = await tenant_tokens(database_url)
    api = services.api_url
    try:
        big = _jsonl(LIMIT + 200_000)
        for body in (big, _chunked(big)):  # a declared Content-Length, and a chunked body that lies about nothing
            status, reply = await _call(f"{api}/api/v1/inputs", tokens["alpha"], "POST", data=body)
            assert (status, reply["error"]["code"]) == (413, "too_large"), (status, reply)
            assert f"{LIMIT:,}" in reply["error"]["message"]
        assert _files(services.store_root / "inputs") == []  # no object, no temp file
        status, reply = await _call(f"{api}/api/v1/inputs", tokens["alpha"], "POST", data=_jsonl(LIMIT // 2))
        assert status == 201, reply

        # An output PUT through a lease's signed URL.
        status, task = await _call(f"{api}/api/v1/tasks", tokens["admin"], "POST", json={
            "team": "alpha", "project": "p", "name": "t", "kind": "sleep", "input": {"uri": reply["uri"]}})
        assert status == 201, task
        services.start("splitter")
        status, reg = await _call(f"{api}/api/v1/executors/register", tokens["executor"], "POST",
                                  json={"name": "ex", "kinds": ["sleep"]})
        assert status == 201, reg

        async def claimed() -> Any:  # the splitter may take a few long polls to start on a busy machine
            status, lease = await _call(f"{api}/api/v1/executors/{reg['executor_id']}/claim?wait=5",
                                        tokens["executor"], "POST")
            assert status in (200, 204), lease
            return lease if status == 200 else None

        lease = await eventually(claimed, "a lease", timeout_s=60)
        put_url = lease["subtask"]["output"]["url"]
        for body in (big, _chunked(big)):
            status, reply = await _call(put_url, None, "PUT", data=body, content_type="application/octet-stream")
            assert (status, reply["error"]["code"]) == (413, "too_large"), (status, reply)
            assert f"{LIMIT:,}" in reply["error"]["message"]
        assert _files(services.store_root / "outputs") == []
        status, reply = await _call(put_url, None, "PUT", data=b'{"id": "r00000000", "slept_ms": 0}\n',
                                    content_type="application/octet-stream")
        assert status == 200, reply
    finally:
        services.stop_all()


async def test_a_team_cannot_store_more_input_than_its_quota(database_url: str, tmp_path: Path) -> None:
    quota = 3000
    services = await _api_only(database_url, tmp_path, MINIONS_TEAM_INPUT_QUOTA_BYTES=str(quota))
    tokens = await tenant_tokens(database_url)
    uploads = f"{services.api_url}/api/v1/inputs"
    try:
        status, first = await _call(uploads, tokens["alpha"], "POST", data=_jsonl(2000))
        assert status == 201, first
        for body in (_jsonl(2000), _chunked(_jsonl(2000))):
            status, reply = await _call(uploads, tokens["alpha"], "POST", data=body)
            assert (status, reply["error"]["code"]) == (413, "quota_exceeded"), (status, reply)
            assert f"{quota:,}" in reply["error"]["message"]
        status, reply = await _call(f"{services.api_url}/api/v1/tasks", tokens["alpha"], "POST", json={
            "team": "alpha", "project": "p", "name": "inline", "kind": "sleep",
            "input": {"records": [{"id": f"r{i}", "ms": 0} for i in range(100)]}})
        assert (status, reply["error"]["code"]) == (413, "quota_exceeded"), (status, reply)
        # Other teams have their own quota.
        status, reply = await _call(uploads, tokens["beta"], "POST", data=_jsonl(2000))
        assert status == 201, reply
        # A task reads the upload: it stays until the task is deleted (a running task cannot be).
        task_url = f"{services.api_url}/api/v1/tasks/alpha/p/uses-it"
        status, reply = await _call(f"{services.api_url}/api/v1/tasks", tokens["alpha"], "POST", json={
            "team": "alpha", "project": "p", "name": "uses-it", "kind": "sleep", "input": {"uri": first["uri"]}})
        assert status == 201, reply
        status, reply = await _call(task_url, tokens["alpha"], "DELETE")
        assert (status, reply["error"]["code"]) == (409, "not_finished"), (status, reply)
        done = _minions(services, "gc", "--gc-grace-s", "0")
        assert done.returncode == 0 and _exists(first["uri"]), done.stderr
        assert (await _call(f"{task_url}/cancel", tokens["alpha"], "POST"))[0] == 200
        assert (await _call(task_url, tokens["alpha"], "DELETE"))[0] == 200
        # Unreferenced now: garbage after the grace period; gc gives the room back.
        done = _minions(services, "gc", "--gc-grace-s", "0")
        assert done.returncode == 0, done.stderr
        status, reply = await _call(uploads, tokens["alpha"], "POST", data=_jsonl(2000))
        assert status == 201, reply
    finally:
        services.stop_all()


async def test_gc_returns_the_space_of_an_api_killed_mid_upload(database_url: str, tmp_path: Path) -> None:
    services = await _api_only(database_url, tmp_path)
    tokens = await tenant_tokens(database_url)
    _reader, writer = await asyncio.open_connection("127.0.0.1", services.port)
    declared, sent = 64 * 1024 * 1024, 0
    writer.write((f"POST /api/v1/inputs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tokens['alpha']}\r\n"
                  f"Content-Type: application/x-ndjson\r\nContent-Length: {declared}\r\n\r\n").encode())
    chunk = _jsonl(1 << 20)
    while sent < 8 * len(chunk):
        writer.write(chunk)
        await writer.drain()
        sent += len(chunk)

    async def partial() -> list[Path]:
        found = [p for p in _files(services.store_root / "inputs") if p.name.endswith(".tmp")]
        return found if found and found[0].stat().st_size >= 4 * len(chunk) else []

    left = await eventually(partial, "the upload's temp file to grow")
    services.running["api"].kill()  # kill -9 mid-upload
    writer.close()
    assert left[0].exists() and left[0].stat().st_size >= 4 * len(chunk)

    dry = _minions(services, "gc", "--gc-grace-s", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would free" in dry.stdout and "1 partial writes" in dry.stdout, dry.stdout
    assert left[0].exists()  # a dry run deletes nothing
    done = _minions(services, "gc", "--gc-grace-s", "0")
    assert done.returncode == 0, done.stderr
    assert "1 partial writes" in done.stdout and "gc [" in done.stderr, (done.stdout, done.stderr)
    assert _files(services.store_root / "inputs") == []  # the space is back


async def test_the_watchdog_sweeps_unreferenced_inputs_and_outputs_of_deleted_tasks(database_url: str,
                                                                                     tmp_path: Path) -> None:
    # Inline records as input objects (not kept in the database): their sweep is what is tested.
    services = Services(database_url, tmp_path / "services",
                        extra_env={"MINIONS_GC_INTERVAL_S": "1", "MINIONS_GC_GRACE_S": "3",
                                   "MINIONS_INPUT_IN_DATABASE_BYTES": "0"})
    await services.start_all()
    tokens = await tenant_tokens(database_url)
    api, store = services.api_url, services.store_root
    executor = SleepExecutor(api, tokens["executor"], "gc-ex")
    stop = asyncio.Event()
    runner = asyncio.create_task(executor.run(stop))
    try:
        status, unused = await _call(f"{api}/api/v1/inputs", tokens["alpha"], "POST", data=_jsonl(5000))
        assert status == 201, unused
        ids = {}
        for name in ("kept", "deleted"):
            status, task = await _call(f"{api}/api/v1/tasks", tokens["alpha"], "POST", json={
                "team": "alpha", "project": "p", "name": name, "kind": "sleep", "subtask_size": 2,
                "input": {"records": [{"id": f"{name}-{i}", "ms": 1} for i in range(4)]}})
            assert status == 201, task

            async def completed(name: str = name) -> Any:
                _, body = await _call(f"{api}/api/v1/tasks/alpha/p/{name}", tokens["alpha"], "GET")
                return body if body["status"] == "completed" else None

            ids[name] = (await completed_or_fail(completed, services)), task["input_uri"]
        conn = await connect(database_url)
        try:
            kept_id = await conn.fetchval("SELECT id FROM tasks WHERE name = 'kept'")
            deleted_id = await conn.fetchval("SELECT id FROM tasks WHERE name = 'deleted'")
        finally:
            await conn.close()
        status, reply = await _call(f"{api}/api/v1/tasks/alpha/p/deleted", tokens["alpha"], "DELETE")
        assert status == 200, reply
        # An attempt that never committed (its executor was lost after the PUT).
        dead = store / "outputs" / str(kept_id) / "0" / f"7-{uuid.uuid4()}.jsonl"
        dead.write_bytes(b'{"id": "x"}\n')
        # A complete copies the verified output under results/ and removes the attempt's own object.
        committed = sorted((store / "results" / str(kept_id)).rglob("*.jsonl"))
        assert len(committed) == 2
        deleted_outputs = sorted((store / "results" / str(deleted_id)).rglob("*.jsonl"))
        assert len(deleted_outputs) == 2
        # A verified copy no subtask names (its complete lost a race).
        orphan = store / "results" / str(kept_id) / "0" / f"3-{uuid.uuid4()}-{'0' * 16}.jsonl"
        orphan.write_bytes(b'{"id": "x"}\n')
        deleted_outputs.append(orphan)

        def gone(uri_or_path: str | Path) -> bool:
            path = uri_or_path if isinstance(uri_or_path, Path) else Path(uri_or_path.removeprefix("file://"))
            return not path.exists()

        async def swept() -> bool:
            return all(gone(p) for p in (unused["uri"], ids["deleted"][1], dead, *deleted_outputs))

        await eventually(swept, "the watchdog's sweep to delete the garbage", timeout_s=60)
        assert not any(gone(p) for p in (ids["kept"][1], *committed))  # what a task still reads stays
        status, results = await _call(f"{api}/api/v1/tasks/alpha/p/kept/results", tokens["alpha"], "GET")
        assert status == 200 and results.count(b"\n") == 4
        assert "gc_swept" in services.running["watchdog"].log()
    finally:
        stop.set()
        await asyncio.gather(runner, return_exceptions=True)
        services.stop_all()


async def completed_or_fail(check: Any, services: Services) -> Any:
    try:
        return await eventually(check, "the task to complete")
    except AssertionError:
        raise AssertionError(services.logs()) from None


async def test_gc_on_s3_deletes_unreferenced_uploads_and_aborts_abandoned_multipart_uploads(
        database_url: str, tmp_path: Path) -> None:
    bucket = "minions-gc"
    with moto_server(bucket) as endpoint:
        env = {**FAKE_ENV, "MINIONS_S3_ENDPOINT_URL": endpoint}
        services = Services(database_url, tmp_path / "services", store=f"s3://{bucket}/minions", extra_env=env)
        services.workdir.mkdir(parents=True)
        services.start("api")
        try:
            await services.wait_healthy()
            tokens = await tenant_tokens(database_url)
            uploads = f"{services.api_url}/api/v1/inputs"
            status, unused = await _call(uploads, tokens["alpha"], "POST", data=_jsonl(3000))
            assert status == 201, unused
            status, used = await _call(uploads, tokens["alpha"], "POST", data=_jsonl(3000))
            assert status == 201, used
            status, task = await _call(f"{services.api_url}/api/v1/tasks", tokens["alpha"], "POST", json={
                "team": "alpha", "project": "p", "name": "t", "kind": "sleep", "input": {"uri": used["uri"]}})
            assert status == 201, task
        finally:
            services.stop_all()
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        # What an API killed in the middle of a large upload leaves: an unfinished multipart upload.
        s3.create_multipart_upload(Bucket=bucket, Key="minions/inputs/uploads/killed.jsonl")

        done = _minions(services, "gc", "--gc-grace-s", "0", "--store", f"s3://{bucket}/minions",
                        "--s3-endpoint-url", endpoint, env=env)
        assert done.returncode == 0, done.stderr
        assert "1 partial writes" in done.stdout and "1 inputs" in done.stdout, done.stdout
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="minions/").get("Contents", [])]
        assert keys == [used["uri"].removeprefix(f"s3://{bucket}/")]  # the one a task reads stays
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
