"""The S3 path end to end: the services on an S3-compatible server (moto), executors that only ever
see presigned URLs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from minions import jsoncodec
from minions.sdk import MinionsClient
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.sleep_executor import SleepExecutor
from tests.e2e.test_control_plane import task_results, wait_for_status
from tests.support.s3 import FAKE_ENV, moto_server

BUCKET = "minions-e2e"


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    with moto_server(BUCKET) as endpoint:
        yield endpoint


async def test_task_through_s3_inline_and_uploaded_inputs(database_url: str, tmp_path: Path,
                                                          s3_endpoint: str) -> None:
    services = Services(database_url, tmp_path / "services", store=f"s3://{BUCKET}/minions",
                        extra_env={**FAKE_ENV, "MINIONS_S3_ENDPOINT_URL": s3_endpoint})
    await services.start_all()
    admin, executor_token = await make_tokens(database_url)
    executors = [SleepExecutor(services.api_url, executor_token, f"s3-{i}") for i in range(2)]
    stop = asyncio.Event()
    runners = [asyncio.create_task(e.run(stop)) for e in executors]
    try:
        async with MinionsClient(services.api_url, admin) as client:
            records = [{"id": f"r{i}", "ms": 1} for i in range(60)]
            await client.submit({"team": "search", "project": "ranker", "name": "inline", "kind": "sleep",
                                 "input": {"records": records}, "subtask_size": 7})
            uploaded = await client.upload_input(b"".join(jsoncodec.dumps_line(r) for r in records))
            assert uploaded.startswith(f"s3://{BUCKET}/minions/inputs/")
            await client.submit({"team": "search", "project": "ranker", "name": "by-uri", "kind": "sleep",
                                 "input": {"uri": uploaded}, "subtask_size": 9})
            for name in ("inline", "by-uri"):
                task = await wait_for_status(client, name, ("completed", "failed", "cancelled"), timeout=60)
                assert task["status"] == "completed", (task, services.logs())
                results = await task_results(client, name)
                assert [r["id"] for r in results] == [r["id"] for r in records]
    finally:
        stop.set()
        await asyncio.gather(*runners, return_exceptions=True)
        services.stop_all()
    # Results live in the bucket, one verified copy per committed attempt (made at complete, which
    # then removes the attempt's own object).
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="minions/results/").get("Contents", [])]
    assert len(keys) == 9 + 7
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix="minions/outputs/").get("KeyCount", 0) == 0
