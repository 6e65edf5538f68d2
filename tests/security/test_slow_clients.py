"""Slow clients cannot pin the API's sockets. Headers that dribble in are cut
after the header timeout, a body that trickles gets 408 after the body timeout, one address holds
at most MINIONS_MAX_CONNECTIONS_PER_IP connections (more: 429), and health answers throughout.

Connections come from 127.0.0.1; the health checks from 127.0.0.2 (another address on loopback),
as a monitor would from its own host."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.factories import make_token
from minions.testing.processes import Services

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
PER_IP = 60


@pytest.fixture
async def api(services: Services, database_url: str) -> AsyncIterator[tuple[Services, str]]:
    conn = await connect(database_url)
    try:
        user, _ = await make_token(conn, "user", "alpha")
    finally:
        await conn.close()
    services.extra_env.update(MINIONS_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
                              MINIONS_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S), MINIONS_BODY_MIN_RATE="1024",
                              MINIONS_MAX_CONNECTIONS_PER_IP=str(PER_IP))
    services.workdir.mkdir(parents=True)
    services.start("api")
    await services.wait_healthy()
    yield services, user


async def _open(port: int, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes | None:
    """What the server sent before closing, or None if it still holds the connection."""
    received = b""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            chunk = await asyncio.wait_for(reader.read(65536), left)
            if not chunk:
                return received
            received += chunk
    except TimeoutError:
        return None
    except ConnectionError:
        return received
    return None


async def _dribble(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(every_s)


async def _health(port: int) -> int:
    reader, writer = await _open(port, "127.0.0.2")
    writer.write(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return int(reply.split(b" ", 2)[1])


async def test_headers_that_dribble_in_are_cut_off(api: tuple[Services, str]) -> None:
    services, _ = api
    connections = [await _open(services.port) for _ in range(20)]
    head = b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    dribblers = [asyncio.create_task(_dribble(w, head, 0.1)) for _, w in connections]
    try:
        outcomes = await asyncio.gather(*(_closed_within(r, HEADER_TIMEOUT_S + 8) for r, _ in connections))
    finally:
        for task in dribblers:
            task.cancel()
    assert all(outcome is not None for outcome in outcomes), "slow-header connections still held"
    assert await _health(services.port) == 200


async def test_a_body_that_trickles_gets_408(api: tuple[Services, str]) -> None:
    services, user = api
    reader, writer = await _open(services.port)
    writer.write(b"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + user.encode() + b"\r\nContent-Length: 100000\r\n\r\n")
    dribbler = asyncio.create_task(_dribble(writer, b'{"team": "alpha", ' + b" " * 5000, 0.1))
    try:
        reply = await _closed_within(reader, BODY_TIMEOUT_S + 8)
    finally:
        dribbler.cancel()
    assert reply is not None, "slow-body connection still held"
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    error = jsoncodec.loads(reply.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout"


async def test_one_address_holds_at_most_the_cap_and_health_stays_up(api: tuple[Services, str]) -> None:
    services, _ = api
    held = [await _open(services.port) for _ in range(PER_IP)]
    extra = [await _open(services.port) for _ in range(40)]
    refusals = await asyncio.gather(*(_closed_within(r, 5) for r, _ in extra))
    assert all(r is not None and r.startswith(b"HTTP/1.1 429") for r in refusals), refusals[:3]
    assert b"too_many_connections" in (refusals[0] or b"")
    assert await _health(services.port) == 200  # another address is not capped

    # A slowloris of a few hundred connections: refused beyond the cap, cut at the header timeout,
    # and health answers every time meanwhile.
    flood = [asyncio.create_task(_slowloris(services.port)) for _ in range(300)]
    try:
        for _ in range(10):
            assert await _health(services.port) == 200
            await asyncio.sleep(0.3)
    finally:
        for task in flood:
            task.cancel()
    for _, writer in held + extra:
        writer.close()


async def _slowloris(port: int) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        _reader, writer = await _open(port)
        await _dribble(writer, b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: y\r\n" * 1000, 0.5)
