"""Bounded memory on every route: every JSON body of the API, not /v1's alone, is bounded
in JSON values before it is decoded (services/api/http/json_bounds.py, through bodies.json_object), and
the routes whose bodies are small by nature have caps that fit them (413 before a byte is decoded).

A hostile executor's complete (the one executor route that keeps the API's 64 MiB cap: it carries
inline outputs) of 12 MB of `[{}, {}, ...]` decoded into ~25 times its size before; now it is refused
at the 100,001st value, the worker's peak within 4x the body. Measured on the real API process from
/proc, as tests/security/test_inline_memory.py does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from minions import jsoncodec
from minions.services.api.admin.tokens_routes import MAX_CREATION_BYTES
from minions.services.api.app import refused_value
from minions.services.api.http.bodies import TOKEN_LIST_BYTES
from minions.services.api.http.json_bounds import MAX_VALUES
from minions.services.api.leasing.routes import MAX_FAILURE_BATCH_BYTES, MAX_FAILURE_BYTES
from minions.testing.processes import Services
from tests.security.test_inline_memory import _reset_peak, _rss, _settle
from tests.support.api import ApiHarness, running_api
from tests.support.tenants import tenant_tokens

MB = 1 << 20
TASK = {"team": "alpha", "project": "bounds", "name": "t1", "kind": "sleep", "subtask_size": 1,
        "input": {"records": [{"id": "r1", "ms": 0}, {"id": "r2", "ms": 0}]}}


def _empty_objects(size: int) -> bytes:
    """`{"records": 1, "junk": [{}, {}, ...]}` of about `size` bytes: 3 bytes a value."""
    return b'{"records":1,"junk":[' + b",".join([b"{}"] * (size // 3)) + b"]}"


async def _call(session: aiohttp.ClientSession, url: str, token: str, path: str, body: Any = None,
                data: bytes | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    payload = jsoncodec.dumps(body) if body is not None else data
    async with session.post(url + path, data=payload, headers=headers) as resp:
        raw = await resp.read()
        return resp.status, jsoncodec.loads(raw) if raw else None


async def _leases(session: aiohttp.ClientSession, url: str, tokens: dict[str, str]) -> list[str]:
    """Two leases of a fresh sleep task, held by one executor."""
    status, reply = await _call(session, url, tokens["alpha"], "/api/v1/tasks", TASK)
    assert status == 201, reply
    status, reply = await _call(session, url, tokens["executor"], "/api/v1/executors/register",
                                {"name": "hostile", "hardware": {}, "kinds": ["sleep"]})
    assert status == 201, reply
    executor_id = reply["executor_id"]
    status, reply = await _call(session, url, tokens["executor"], f"/api/v1/executors/{executor_id}/claim?max=2&wait=5")
    assert status == 200, reply
    return [item["lease"]["token"] for item in reply["leases"]]


async def test_a_complete_of_millions_of_values_is_refused_within_4x_its_size(services: Services) -> None:
    services.workdir.mkdir(parents=True)
    api = services.start("api")
    await services.wait_healthy()
    assert api.process is not None
    pid, url = api.process.pid, services.api_url
    tokens = await tenant_tokens(services.database_url)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        first, second = await _leases(session, url, tokens)
        # Warm the path (threads, decoder) with a small refused body.
        status, reply = await _call(session, url, tokens["executor"], f"/api/v1/leases/{first}/complete",
                                    data=_empty_objects(2 * MB))
        assert status == 422, reply
        body = _empty_objects(12 * MB)
        baseline = await _settle(pid)
        _reset_peak(pid)
        status, reply = await _call(session, url, tokens["executor"], f"/api/v1/leases/{first}/complete", data=body)
        grown = _rss(pid, "VmHWM") - baseline
        assert status == 422 and reply["error"]["code"] == "too_many_values", reply
        assert f"more than {MAX_VALUES:,} JSON values" in reply["error"]["message"]
        assert grown < 4 * len(body), f"peak RSS rose {grown / MB:.0f} MB for a {len(body) / MB:.0f} MB body"
        # Nothing was lost: the lease is still live, and an honest complete of it commits.
        output = '{"id":"r1"}\n'
        status, reply = await _call(session, url, tokens["executor"], f"/api/v1/leases/{first}/complete",
                                    {"records": 1, "output": output})
        assert status == 200, reply
        # A body over 64 KiB within the bounds is still taken (an inline output is one value).
        long_error = {"error": "x" * (200 * 1024), "retryable": True}
        status, reply = await _call(session, url, tokens["executor"], f"/api/v1/leases/{second}/fail", long_error)
        assert status == 200, reply


@pytest.mark.parametrize(("path", "token", "limit"), [
    ("/api/v1/executors/{executor}/heartbeat", "executor", TOKEN_LIST_BYTES),
    ("/api/v1/leases/release", "executor", TOKEN_LIST_BYTES),
    ("/api/v1/leases/{lease}/fail", "executor", MAX_FAILURE_BYTES),
    ("/api/v1/leases/fail", "executor", MAX_FAILURE_BATCH_BYTES),
    ("/api/v1/tokens", "admin", MAX_CREATION_BYTES),
])
async def test_small_bodies_have_caps_that_fit_their_route(database_url: str, tmp_path: Path, path: str,
                                                           token: str, limit: int) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        executor = await api.register()
        lease = await _one_lease(api, executor)
        where = path.format(executor=executor, lease=lease)
        over = b'{"leases":["' + b"x" * limit + b'"]}'
        reply = await api.call("POST", where, token=token, data=over, headers={"Content-Type": "application/json"})
        assert reply.status == 413 and reply.error["code"] == "too_large", reply.body
        assert f"{limit:,} bytes, the limit of this route" in reply.error["message"]
        # The lease the 413 named is untouched: its executor still holds it.
        beat = await api.call("POST", f"/api/v1/executors/{executor}/heartbeat", token="executor",
                              json={"leases": [lease]})
        assert beat.status == 200 and beat.body["leases"] == {lease: "ok"}, beat.body


async def _one_lease(api: ApiHarness, executor: str) -> str:
    reply = await api.call("POST", "/api/v1/tasks", json={**TASK, "team": "search"})
    assert reply.status == 201, reply.body
    reply = await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=5", token="executor")
    assert reply.status == 200, reply.body
    token: str = reply.body["lease"]["token"]
    return token


def test_a_value_the_database_refuses_is_named_without_its_text() -> None:
    """A value PostgreSQL refuses is a 422 saying what kind of value, never the database's own words."""
    nul = asyncpg.exceptions.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00')
    assert refused_value(nul) == ("a value cannot be stored: text holds a character that cannot be stored "
                                  "(a NUL, U+0000, or invalid UTF-8)")
    other = asyncpg.exceptions.DataError("malformed array literal: internal detail")
    assert "internal detail" not in refused_value(other) and "literal" not in refused_value(other)
