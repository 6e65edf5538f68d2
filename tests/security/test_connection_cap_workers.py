"""MINIONS_MAX_CONNECTIONS_PER_IP holds per address across the API's workers, not
per worker, and a refused connection is one warning line, not an ERROR traceback per connection.

A 2-worker API (each worker binds the port with SO_REUSEPORT, so the kernel spreads connections over
both); one address opens three times the cap and keeps every connection it gets."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from minions.services.api.main import WORKER_HEADER
from minions.testing.processes import Services
from minions.testing.waiting import eventually

PER_IP = 30


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.1", 0))


async def _refusal(reader: asyncio.StreamReader) -> bytes | None:
    """What the server sent before closing a connection that sent nothing (a refusal comes at once),
    or None if it holds it."""
    try:
        return await asyncio.wait_for(reader.read(), 3)
    except TimeoutError:
        return None


async def _worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """The worker that answers a kept-alive GET /health on this connection (left open)."""
    writer.write(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    assert lines[0].startswith("HTTP/1.1 200"), lines[0]
    return headers[WORKER_HEADER.lower()]


def _events(log: str) -> list[dict[str, Any]]:
    """The JSON events of a log two workers wrote to (one's line may run into the other's)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := log.find("{", at)) >= 0:
        try:
            event, at = decoder.raw_decode(log, at)
            found.append(event)
        except json.JSONDecodeError:
            at += 1
    return found


async def test_the_cap_holds_per_address_across_workers_and_a_refusal_is_one_warning(services: Services) -> None:
    services.extra_env.update(MINIONS_API_WORKERS="2", MINIONS_MAX_CONNECTIONS_PER_IP=str(PER_IP),
                              MINIONS_HEADER_TIMEOUT_S="60")
    services.workdir.mkdir(parents=True)
    api = services.start("api")
    await services.wait_healthy()

    async def both_workers_listen() -> bool:  # the first to listen makes the API healthy; wait for both
        seen = set()
        for _ in range(20):
            reader, writer = await _open(services.port)
            seen.add(await _worker(reader, writer))
            writer.close()
        return len(seen) == 2

    await eventually(both_workers_listen, "both workers listening", timeout_s=30)

    async def admitted_again() -> bool:  # closed connections gave their counts back, in both workers
        again = [await _open(services.port) for _ in range(PER_IP)]
        try:
            return not any(await asyncio.gather(*(_refusal(reader) for reader, _ in again)))
        finally:
            for _, writer in again:
                writer.close()

    await eventually(admitted_again, "the probes' connections given back", timeout_s=20)

    connections = [await _open(services.port) for _ in range(3 * PER_IP)]
    try:
        refusals = await asyncio.gather(*(_refusal(reader) for reader, _ in connections))
        held = [c for c, refusal in zip(connections, refusals, strict=True) if refusal is None]
        refused = [r for r in refusals if r is not None]
        assert len(held) == PER_IP, f"{len(held)} connections held by one address, the cap is {PER_IP}"
        assert len(refused) == 2 * PER_IP and all(r.startswith(b"HTTP/1.1 429") for r in refused), refused[:2]
        workers = Counter([await _worker(reader, writer) for reader, writer in held])
        assert len(workers) == 2, f"every held connection on one worker: {workers}"
    finally:
        for _, writer in connections:
            writer.close()

    await eventually(admitted_again, "connections admitted after the held ones closed", timeout_s=20)

    log = api.log()
    events = _events(log)
    refusals = [e for e in events if e.get("event") == "connections_refused"]
    assert refusals and all(e["level"] == "warning" and e["limit"] == PER_IP for e in refusals), refusals
    # One warning per worker and episode (a retry of admitted_again may start another), never one per
    # refused connection (60 here).
    assert len(refusals) <= 6, f"one warning per worker for an episode, not one per connection: {len(refusals)}"
    assert "Traceback" not in log and "never retrieved" not in log, log[-3000:]
    assert not [e for e in events if e.get("level") in ("error", "critical")], log[-3000:]
