"""Bad input is a clear 4xx in the project's error shape, never a 500: JSON nested
deeper than anything parses safely (in an inline record, in `hardware` at register, in any body),
and bytes that are not UTF-8 in the Authorization header (or any other header)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.factories import make_token
from minions.testing.processes import Services


@pytest.fixture
async def api(services: Services, database_url: str) -> AsyncIterator[tuple[Services, str, str]]:
    conn = await connect(database_url)
    try:
        user, _ = await make_token(conn, "user", "alpha")
        executor, _ = await make_token(conn, "executor")
    finally:
        await conn.close()
    services.workdir.mkdir(parents=True)
    services.start("api")
    await services.wait_healthy()
    yield services, user, executor
    assert "unhandled_error" not in services.running["api"].log()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


async def post(url: str, token: str, body: bytes) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.post(
            url, data=body, headers={"Authorization": f"Bearer {token}",
                                     "Content-Type": "application/json"}) as resp:
        return resp.status, jsoncodec.loads(await resp.read())


async def test_an_inline_record_nested_260_deep_is_422(api: tuple[Services, str, str]) -> None:
    services, user, _ = api
    body = (b'{"team":"alpha","project":"p","name":"deep","kind":"sleep","input":{"records":['
            b'{"id":"fine","ms":1},{"id":"deep","ms":1,"meta":' + nested(260) + b"}]}}")
    status, reply = await post(services.api_url + "/api/v1/tasks", user, body)
    assert status == 422, reply
    error = reply["error"]
    assert isinstance(error, dict) and "255 levels" in error["fields"]["input.records[1]"]


async def test_hardware_nested_1000_deep_at_register_is_400(api: tuple[Services, str, str]) -> None:
    services, _, executor = api
    body = b'{"name":"e1","kinds":["sleep"],"hardware":{"gpu":' + nested(1000) + b"}}"
    status, reply = await post(services.api_url + "/api/v1/executors/register", executor, body)
    assert (status, reply["error"]["code"]) == (400, "too_deep"), reply  # type: ignore[index]


async def test_any_json_body_nested_too_deep_is_4xx(api: tuple[Services, str, str]) -> None:
    services, user, executor = api
    for depth, (path, token, body) in ((d, case) for d in (65, 300, 1000, 100_000) for case in [
        ("/api/v1/tasks", user, b'{"team":"alpha","project":"p","name":"n","kind":"sleep","params":'
                                + nested(d) + b',"input":{"records":[{"id":1,"ms":1}]}}'),
        ("/api/v1/tasks", user, b'{"team":"alpha","x":' + nested(d) + b"}"),
        ("/api/v1/executors/register", executor, b'{"name":"e","kinds":["sleep"],"x":' + nested(d) + b"}"),
        ("/api/v1/executors/00000000-0000-0000-0000-000000000000/heartbeat", executor,
         b'{"leases":' + nested(d) + b"}"),
        ("/api/v1/leases/00000000-0000-0000-0000-000000000000/fail", executor,
         b'{"error":' + nested(d) + b"}"),
    ]):
        status, reply = await post(services.api_url + path, token, body)
        assert 400 <= status < 500, (path, depth, status, reply)
        assert "error" in reply


def raw_request(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


async def test_authorization_that_is_not_utf8_is_401(api: tuple[Services, str, str]) -> None:
    services, _, _ = api
    for value in (b"Bearer \xff\xfe\xfd", b"Bearer caf\xe9", b"\xc3\x28", b"Bearer mn_\x80x"):
        head = (b"GET /api/v1/tasks HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: " + value
                + b"\r\n\r\n")
        reply = await asyncio.to_thread(raw_request, services.port, head)
        status_line, _, rest = reply.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 401"), reply[:300]
        body = jsoncodec.loads(rest.partition(b"\r\n\r\n")[2])
        assert body["error"]["code"] == "unauthorized"


async def test_other_headers_that_are_not_utf8_are_no_500(api: tuple[Services, str, str]) -> None:
    services, user, _ = api
    headers = (b"Range: bytes=\xff-", b"If-None-Match: \xff\xfe", b"Content-Type: text/\xff", b"Accept: \xff",
               b"X-Anything: \xe9\xff")
    paths = (b"/api/v1/tasks", b"/", b"/api/v1/store/inputs/x.jsonl?method=GET&expires=1&sig=00", b"/api/v1/health")
    for header, path in ((h, p) for h in headers for p in paths):
        head = (b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
                + user.encode() + b"\r\n" + header + b"\r\n\r\n")
        reply = await asyncio.to_thread(raw_request, services.port, head)
        assert reply.startswith((b"HTTP/1.1 2", b"HTTP/1.1 3", b"HTTP/1.1 4", b"HTTP/1.0 4")), reply[:300]
