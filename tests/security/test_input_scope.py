"""`input.uri` is scoped to the submitter's team. A task may read its team's own
uploads and inline inputs, or s3:// prefixes an operator allowed for the team; anything else is
403 input_not_allowed and nothing is created (real API processes, real PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import pytest

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.processes import IMPORT_ROOT, Services
from minions.testing.sleep_executor import SleepExecutor
from minions.testing.waiting import eventually
from tests.support.s3 import FAKE_ENV, moto_server
from tests.support.tenants import tenant_tokens

BUCKET = "minions-scope"
RECORDS = b"".join(jsoncodec.dumps_line({"id": f"secret-{i}", "ms": 1}) for i in range(5))



async def _call(api_url: str, token: str, method: str, path: str, *, json: Any = None,
                data: bytes | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    if data is not None:
        headers["Content-Type"] = "application/x-ndjson"
    async with aiohttp.ClientSession() as session, session.request(
            method, api_url + path, json=json, data=data, headers=headers) as resp:
        raw = await resp.read()
        return resp.status, jsoncodec.loads(raw) if raw and resp.content_type == "application/json" else raw


def _task(team: str, name: str, uri: str) -> dict[str, Any]:
    return {"team": team, "project": "p", "name": name, "kind": "sleep", "input": {"uri": uri}}


async def _task_count(database_url: str) -> int:
    conn = await connect(database_url)
    try:
        count: int = await conn.fetchval("SELECT count(*) FROM tasks")
        return count
    finally:
        await conn.close()


async def _refused(api_url: str, token: str, database_url: str, team: str, uri: str) -> None:
    before = await _task_count(database_url)
    status, body = await _call(api_url, token, "POST", "/api/v1/tasks", json=_task(team, "steal", uri))
    assert status == 403, f"{uri} was accepted as team {team}'s input: {status} {body}"
    assert body["error"]["code"] == "input_not_allowed", body
    assert await _task_count(database_url) == before  # nothing created


async def test_a_team_cannot_read_another_teams_upload_inline_input_or_results(database_url: str,
                                                                                tmp_path: Path) -> None:
    # Inline records as an input object, as big ones always are (a kept input has no URI to name).
    services = Services(database_url, tmp_path / "services", extra_env={"MINIONS_INPUT_IN_DATABASE_BYTES": "0"})
    await services.start_all()
    tokens = await tenant_tokens(database_url)
    executor = SleepExecutor(services.api_url, tokens["executor"], "scope-ex")
    stop = asyncio.Event()
    runner = asyncio.create_task(executor.run(stop))
    try:
        api = services.api_url
        status, upload = await _call(api, tokens["beta"], "POST", "/api/v1/inputs", data=RECORDS)
        assert status == 201, upload
        status, inline = await _call(api, tokens["beta"], "POST", "/api/v1/tasks", json={
            "team": "beta", "project": "p", "name": "inline", "kind": "sleep",
            "input": {"records": [{"id": "b-secret", "ms": 1}]}})
        assert status == 201, inline

        async def beta_done() -> bool:
            _, task = await _call(api, tokens["beta"], "GET", "/api/v1/tasks/beta/p/inline")
            return bool(task["status"] == "completed")

        await eventually(beta_done, "team beta's task to complete")
        outputs = sorted((services.store_root / "results").rglob("*.jsonl"))
        assert outputs, "the committed result object is in the store"

        # Team alpha names each of team beta's objects: its upload, its inline input, its result.
        for uri in (upload["uri"], inline["input_uri"], outputs[0].as_uri()):
            await _refused(api, tokens["alpha"], database_url, "alpha", uri)
        # ... and a made-up key in the store, and a path that escapes nothing but is not owned.
        await _refused(api, tokens["alpha"], database_url, "alpha",
                       (services.store_root / "inputs" / "uploads" / "nothing.jsonl").as_uri())

        # Team beta itself may reuse its upload and its inline input; alpha its own upload.
        status, body = await _call(api, tokens["beta"], "POST", "/api/v1/tasks",
                                   json=_task("beta", "again", upload["uri"]))
        assert status == 201, body
        status, body = await _call(api, tokens["beta"], "POST", "/api/v1/tasks",
                                   json=_task("beta", "again-inline", inline["input_uri"]))
        assert status == 201, body
        status, own = await _call(api, tokens["alpha"], "POST", "/api/v1/inputs", data=RECORDS)
        assert status == 201, own
        status, body = await _call(api, tokens["alpha"], "POST", "/api/v1/tasks",
                                   json=_task("alpha", "own", own["uri"]))
        assert status == 201, body
        # An upload made for team beta by an unscoped (admin) token with ?team= is beta's alone.
        status, for_beta = await _call(api, tokens["admin"], "POST", "/api/v1/inputs?team=beta", data=RECORDS)
        assert status == 201, for_beta
        await _refused(api, tokens["alpha"], database_url, "alpha", for_beta["uri"])
        # A scoped token cannot upload for another team.
        status, body = await _call(api, tokens["alpha"], "POST", "/api/v1/inputs?team=beta", data=RECORDS)
        assert (status, body["error"]["code"]) == (403, "wrong_team")
    finally:
        stop.set()
        await asyncio.gather(runner, return_exceptions=True)
        services.stop_all()


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    with moto_server(BUCKET) as endpoint:
        yield endpoint


def _minions(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MINIONS_DATABASE_URL": database_url, "PYTHONPATH": str(IMPORT_ROOT)}
    return subprocess.run([sys.executable, "-m", "minions.cli.main", *args], env=env, cwd=IMPORT_ROOT,
                          capture_output=True, text=True, timeout=60)


async def test_s3_inputs_need_a_prefix_an_operator_allowed_for_the_team(database_url: str, tmp_path: Path,
                                                                         s3_endpoint: str) -> None:
    services = Services(database_url, tmp_path / "services", store=f"s3://{BUCKET}/minions",
                        extra_env={**FAKE_ENV, "MINIONS_S3_ENDPOINT_URL": s3_endpoint})
    services.workdir.mkdir(parents=True)
    services.start("api")
    await services.wait_healthy()
    tokens = await tenant_tokens(database_url)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    for key in ("shared/alpha/in.jsonl", "shared/alpha-other/in.jsonl", "private/beta.jsonl"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=RECORDS)
    api = services.api_url
    try:
        allowed = f"s3://{BUCKET}/shared/alpha/in.jsonl"
        # Today any readable s3:// URI goes: the server's credentials read whatever it names.
        for uri in (allowed, f"s3://{BUCKET}/private/beta.jsonl"):
            await _refused(api, tokens["alpha"], database_url, "alpha", uri)

        done = _minions(database_url, "team", "allow-input", "alpha", f"s3://{BUCKET}/shared/alpha")
        assert done.returncode == 0, done.stderr
        listed = _minions(database_url, "team", "inputs", "alpha")
        assert f"s3://{BUCKET}/shared/alpha/" in listed.stdout, listed
        status, body = await _call(api, tokens["alpha"], "POST", "/api/v1/tasks", json=_task("alpha", "ok", allowed))
        assert status == 201, body
        # The prefix is a folder: a sibling with the same start, a dot-dot escape and another team stay out.
        for uri in (f"s3://{BUCKET}/shared/alpha-other/in.jsonl",
                    f"s3://{BUCKET}/shared/alpha/../../private/beta.jsonl"):
            await _refused(api, tokens["alpha"], database_url, "alpha", uri)
        await _refused(api, tokens["beta"], database_url, "beta", allowed)
        bad = _minions(database_url, "team", "allow-input", "alpha", "https://example.com/x")
        assert bad.returncode != 0 and "s3://" in bad.stderr

        done = _minions(database_url, "team", "disallow-input", "alpha", f"s3://{BUCKET}/shared/alpha/")
        assert done.returncode == 0, done.stderr
        await _refused(api, tokens["alpha"], database_url, "alpha", allowed)
    finally:
        services.stop_all()
