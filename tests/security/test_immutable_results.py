"""A committed result cannot change.

An output URL stops working once its lease is no longer live (completed, failed, released, lost) on
the local store; on S3, where a presigned URL cannot be revoked, what it writes after the commit is
never read. Results serve exactly the bytes verified at complete (SHA-256 and size recorded then): a
result changed in the store behind the API's back is an error, never served.

Real services (API, splitter, watchdog as processes) on a real PostgreSQL; a local store, and moto
for S3 (moto checks neither signatures nor expiry, so refusals are tested on the local store)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import boto3
import pytest

from minions.db.connect import connect
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from tests.support.leases import LeaseSteps, sleep_output
from tests.support.s3 import FAKE_ENV, moto_server

BUCKET = "minions-immutable"
# What a writer still holding an output URL tries after its lease ended: injected ids, and more bytes.
INJECTED = b'{"id":"evil","slept_ms":1}\n' * 1000


async def _steps(services: Services, session: aiohttp.ClientSession) -> LeaseSteps:
    await services.start_all()
    admin, executor = await make_tokens(services.database_url)
    return LeaseSteps(services.api_url, admin, executor, session)


@pytest.fixture
async def local(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[LeaseSteps, Services]]:
    # A long lease timeout: the probes pause between steps without heartbeating.
    services = Services(database_url, tmp_path / "services", lease_timeout_s=120)
    try:
        async with aiohttp.ClientSession() as session:
            yield await _steps(services, session), services
    finally:
        services.stop_all()


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    with moto_server(BUCKET) as endpoint:
        yield endpoint


async def test_an_output_url_stops_working_once_its_lease_ends(local: tuple[LeaseSteps, Services]) -> None:
    steps, _ = local
    ids = ["r0", "r1", "r2", "r3"]
    await steps.submit_sleep("sealed", ids, subtask_size=1)
    executor_id = await steps.register("probe")
    leases = [await steps.claim(executor_id) for _ in ids]
    done, failed, released, lost = leases
    url = {n: lease["subtask"]["output"]["url"] for n, lease in enumerate(leases)}

    assert (await steps.put(url[0], sleep_output(["r0"]))).status == 200
    assert (await steps.complete(done)).status == 200
    assert (await steps.end(failed, "fail")).status == 200
    assert (await steps.end(released, "release")).status == 200
    await steps.register("probe")  # the agent restarted: the leases it held are lost
    assert await steps.lease_state(executor_id, lost) == "lost"

    for n, what in enumerate(("completed", "failed", "released", "lost")):
        reply = await steps.put(url[n], INJECTED)
        assert reply.status == 403 and reply.code == "lease_ended", (what, reply)

    # The requeued subtasks are finished by a new attempt; the old URLs still write nothing.
    for _ in range(3):
        lease = await steps.claim(executor_id)
        mine = [ids[lease["subtask"]["subtask_id"]]]
        assert (await steps.put(lease["subtask"]["output"]["url"], sleep_output(mine))).status == 200
        assert (await steps.complete(lease)).status == 200
        assert (await steps.put(lease["subtask"]["output"]["url"], INJECTED)).status == 403
    assert await steps.task_status("sealed") == "completed"
    status, body, whole = await steps.results("sealed")
    assert (status, body, whole) == (200, sleep_output(ids), True)


async def test_results_serve_only_the_bytes_verified_at_complete(local: tuple[LeaseSteps, Services]) -> None:
    steps, services = local
    await steps.submit_sleep("checked", ["a", "b"], subtask_size=2)
    executor_id = await steps.register("probe")
    lease = await steps.claim(executor_id)
    output = sleep_output(["a", "b"])
    assert (await steps.put(lease["subtask"]["output"]["url"], output)).status == 200
    assert (await steps.complete(lease)).status == 200
    # A retried complete (its answer lost on the wire) is answered the same and commits no second copy.
    assert (await steps.complete(lease)).status == 200
    assert await steps.results("checked") == (200, output, True)

    # Someone with access to the store's folder changes the result (same size, then another size).
    objects = [p for p in services.store_root.rglob("*.jsonl") if "inputs" not in p.parts]
    assert len(objects) == 1, objects  # the verified copy; the attempt's object is gone
    for tampered in (output.replace(b'"slept_ms":1', b'"slept_ms":7'), output + output):
        for path in objects:
            await asyncio.to_thread(path.write_bytes, tampered)
        status, body, whole = await steps.results("checked")
        assert not (status == 200 and whole), "a result that changed after complete was served"
        assert b'"slept_ms":7' not in body and body.count(b'"id":"a"') == 0

    # What was checked against: the SHA-256 and size of the bytes verified at complete.
    conn = await connect(services.database_url)
    try:
        row = await conn.fetchrow("SELECT result_key, result_sha256, result_bytes FROM subtasks")
    finally:
        await conn.close()
    assert row["result_sha256"] == hashlib.sha256(output).digest() and row["result_bytes"] == len(output)


async def test_on_s3_a_late_put_never_reaches_results(database_url: str, tmp_path: Path,
                                                      s3_endpoint: str) -> None:
    services = Services(database_url, tmp_path / "services", lease_timeout_s=120,
                        store=f"s3://{BUCKET}/minions",
                        extra_env={**FAKE_ENV, "MINIONS_S3_ENDPOINT_URL": s3_endpoint})
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    try:
        async with aiohttp.ClientSession() as session:
            steps = await _steps(services, session)
            await steps.submit_sleep("s3-sealed", ["a", "b"], subtask_size=2)
            executor_id = await steps.register("probe")
            lease = await steps.claim(executor_id)
            url = lease["subtask"]["output"]["url"]
            output = sleep_output(["a", "b"])
            assert (await steps.put(url, output)).status == 200
            assert (await steps.complete(lease)).status == 200
            # moto honours the presigned URL after the commit (real S3 would too, until it expires):
            # the late write lands on the attempt's key, which results never read.
            assert (await steps.put(url, INJECTED)).status == 200
            assert await steps.results("s3-sealed") == (200, output, True)

            # The verified copy, changed in the bucket behind the API's back, is never served.
            keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="minions/results/")["Contents"]]
            assert len(keys) == 1, keys
            s3.put_object(Bucket=BUCKET, Key=keys[0], Body=output.replace(b'"slept_ms":1', b'"slept_ms":7'))
            status, body, whole = await steps.results("s3-sealed")
            assert not (status == 200 and whole) and b'"slept_ms":7' not in body
    finally:
        services.stop_all()
