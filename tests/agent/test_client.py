"""The executor-protocol client against local HTTP servers: retries, fatal answers, byte ranges."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from aiohttp import web

from minions.agents.macos.client import AuthError, Conflict, ExecutorClient, Quarantined, StorageError
from minions.agents.macos.protocol import InputRef
from minions.backoff import Backoff
from tests.agent.local_http import free_port, serving

FAST = Backoff(first_s=0.01, max_s=0.05, rng=random.Random(1))
REGISTRATION = {"executor_id": "e-1", "heartbeat_interval_s": 30, "lease_timeout_s": 120, "long_poll_s": 30}


def test_backoff_grows_is_capped_and_jittered() -> None:
    backoff = Backoff(first_s=0.5, max_s=30.0, rng=random.Random(7))
    delays = [backoff.delay(n) for n in range(12)]
    assert 0.25 <= delays[0] <= 0.5
    assert all(15.0 <= d <= 30.0 for d in delays[7:])  # capped at 30 s, never less than half of it
    assert len({round(d, 6) for d in delays[7:]}) == 5  # jittered: a fleet does not retry in step
    assert backoff.delay(10_000) <= 30.0


async def test_register_retries_5xx_then_succeeds() -> None:
    calls: list[str | None] = []

    async def register(request: web.Request) -> web.Response:
        calls.append(request.headers.get("Authorization"))
        if len(calls) <= 3:
            return web.json_response({"error": {"code": "db", "message": "database unavailable"}}, status=503)
        assert (await request.json())["name"] == "anna-mbp"
        return web.json_response(REGISTRATION, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/executors/register", register)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        registration = await client.register({"name": "anna-mbp"})
    assert registration.executor_id == "e-1" and registration.long_poll_s == 30
    assert calls == ["Bearer tok"] * 4


async def test_503_with_retry_after_is_retried_no_sooner_than_the_server_asked() -> None:
    arrivals: list[float] = []

    async def register(request: web.Request) -> web.Response:
        arrivals.append(time.monotonic())
        if len(arrivals) == 1:
            return web.json_response({"error": {"code": "database_unavailable", "message": "retry shortly"}},
                                     status=503, headers={"Retry-After": "1"})
        return web.json_response(REGISTRATION, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/executors/register", register)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        await client.register({"name": "x"})
    # FAST backs off 10-50 ms; the server asked for 1 s, and it is the server that is believed.
    assert len(arrivals) == 2 and arrivals[1] - arrivals[0] >= 0.95


async def test_connection_refused_is_retried_until_the_server_comes_up() -> None:
    port = free_port()

    async def register(request: web.Request) -> web.Response:
        return web.json_response(REGISTRATION, status=201)

    app = web.Application()
    app.router.add_post("/api/v1/executors/register", register)

    async with ExecutorClient(f"http://127.0.0.1:{port}", "tok", backoff=FAST) as client:
        attempt = asyncio.create_task(client.register({"name": "x"}))
        await asyncio.sleep(0.3)  # several refused connections meanwhile
        assert not attempt.done()
        async with serving(app, port):
            registration = await asyncio.wait_for(attempt, 5)
    assert registration.executor_id == "e-1"


async def test_401_is_fatal_at_once_and_409_means_lease_gone() -> None:
    hits = {"register": 0}

    async def register(request: web.Request) -> web.Response:
        hits["register"] += 1
        return web.json_response({"error": {"code": "bad_token", "message": "unknown token"}}, status=401)

    async def complete(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "lease_lost", "message": "gone"}}, status=409)

    app = web.Application()
    app.router.add_post("/api/v1/executors/register", register)
    app.router.add_post("/api/v1/leases/{token}/complete", complete)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        with pytest.raises(AuthError, match="MINIONS_TOKEN"):
            await client.register({"name": "x"})
        with pytest.raises(Conflict) as lost:
            await client.complete("lease-1", 10, 1.5)
    assert hits["register"] == 1
    assert lost.value.code == "lease_lost"


async def test_a_quarantined_executor_is_told_so_not_to_check_its_token() -> None:
    """403 `quarantined`: the token is fine; the agent says it is quarantined and why (it
    said "check MINIONS_TOKEN")."""
    async def claim(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "quarantined", "message": "this executor is quarantined: "
                                            "outvoted 2 times"}}, status=403)

    app = web.Application()
    app.router.add_post("/api/v1/executors/{executor_id}/claim", claim)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        with pytest.raises(Quarantined) as refused:
            await client.claim_batch("e-1", 0, 4)
    assert "quarantined" in str(refused.value) and "outvoted 2 times" in str(refused.value)
    assert "MINIONS_TOKEN" not in str(refused.value) and "its token is fine" in str(refused.value)


async def test_claim_heartbeat_release_deregister() -> None:
    seen: list[tuple[str, object]] = []
    lease = {
        "lease": {"token": "L1", "expires_at": "2026-11-29T10:00:00+00:00"},
        "subtask": {
            "team": "search",
            "project": "ranker",
            "task_name": "emb",
            "subtask_id": 7,
            "attempt": 1,
            "kind": "embedding",
            "model": "m",
            "params": {"normalize": True},
            "input": {"url": "http://s/in", "range": [100, 200], "records": 3},
            "output": {"url": "http://s/out"},
        },
    }

    async def claim(request: web.Request) -> web.Response:
        seen.append(("claim", request.query["wait"]))
        return web.json_response(lease) if len(seen) > 1 else web.Response(status=204)

    async def heartbeat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(("heartbeat", body))
        return web.json_response({"leases": {"L1": "cancelled"}})

    async def ok(request: web.Request) -> web.Response:
        seen.append((request.path, None))
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/api/v1/executors/{id}/claim", claim)
    app.router.add_post("/api/v1/executors/{id}/heartbeat", heartbeat)
    app.router.add_post("/api/v1/executors/{id}/deregister", ok)
    app.router.add_post("/api/v1/leases/{token}/release", ok)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        assert await client.claim("e-1", 0.5) is None
        got = await client.claim("e-1", 0.5)
        assert got is not None and got.token == "L1"
        assert (got.subtask.input.start, got.subtask.input.end, got.subtask.label) == (
            100,
            200,
            "search/ranker/emb#7.1",
        )
        states, _ = await client.heartbeat("e-1", ["L1", "L2"])
        assert states == {"L1": "cancelled", "L2": "lost"}
        await client.release("L1")
        await client.deregister("e-1")
    assert seen == [
        ("claim", "0.5"),
        ("claim", "0.5"),
        ("heartbeat", {"leases": ["L1", "L2"]}),
        ("/api/v1/leases/L1/release", None),
        ("/api/v1/executors/e-1/deregister", None),
    ]


OBJECT = b"".join(b'{"id": %d, "text": "line %d"}\n' % (i, i) for i in range(100))
# A presigned URL as S3 writes it: already percent-encoded, %2F included. Re-encoding breaks it.
SIGNED = "/bucket/in.jsonl?X-Amz-Credential=AKIA%2F20261129%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=ab%2Bcd"


async def test_download_sends_range_and_keeps_the_url_encoded() -> None:
    seen: list[tuple[str, str | None, str | None]] = []

    async def get(request: web.Request) -> web.Response:
        rng = request.headers.get("Range")
        seen.append((request.raw_path, rng, request.headers.get("Authorization")))
        if request.query.get("ignore_range"):
            return web.Response(body=OBJECT)
        start, end = (int(x) for x in rng.removeprefix("bytes=").split("-"))  # type: ignore[union-attr]
        return web.Response(status=206, body=OBJECT[start : end + 1])

    app = web.Application()
    app.router.add_get("/bucket/in.jsonl", get)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        body = await client.download(InputRef(url=url + SIGNED, range=[30, 95], records=2))
        whole = await client.download(InputRef(url=url + "/bucket/in.jsonl?ignore_range=1", range=[30, 95], records=2))
    assert body == OBJECT[30:95] == whole
    assert seen[0] == (SIGNED, "bytes=30-94", None)  # byte for byte, and no bearer token to the store


async def test_download_retries_5xx_and_refuses_4xx() -> None:
    hits = {"flaky": 0}

    async def flaky(request: web.Request) -> web.Response:
        hits["flaky"] += 1
        if hits["flaky"] < 3:
            return web.Response(status=500)
        return web.Response(status=206, body=OBJECT[:10])

    async def expired(request: web.Request) -> web.Response:
        return web.Response(status=403, text="<Error>Request has expired</Error>")

    app = web.Application()
    app.router.add_get("/flaky", flaky)
    app.router.add_get("/expired", expired)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        assert await client.download(InputRef(url=url + "/flaky", range=[0, 10], records=1)) == OBJECT[:10]
        with pytest.raises(StorageError, match="expired"):
            await client.download(InputRef(url=url + "/expired", range=[0, 10], records=1))
    assert hits["flaky"] == 3


async def test_upload_is_one_put_of_the_whole_body() -> None:
    puts: list[tuple[bytes, str | None]] = []

    async def put(request: web.Request) -> web.Response:
        puts.append((await request.read(), request.headers.get("Authorization")))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_put("/bucket/out.jsonl", put)
    async with serving(app) as url, ExecutorClient(url, "tok", backoff=FAST) as client:
        await client.upload(url + "/bucket/out.jsonl?X-Amz-Signature=a%2Fb", OBJECT)
    assert puts == [(OBJECT, None)]
