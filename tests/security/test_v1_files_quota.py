"""`/v1/files` had no size cap and no quota (a 100 MB upload was stored, above the
API's 64 MiB body limit, and the team's input usage did not move). An upload now has POST
/api/v1/inputs' cap (MINIONS_MAX_INPUT_BYTES) and counts against the same quota of stored input bytes
(MINIONS_TEAM_INPUT_QUOTA_BYTES, team_input_usage); deleting the file gives the room back. Real API
process, real PostgreSQL."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.processes import Services
from tests.support.tenants import tenant_tokens

CAP = 1_000_000
QUOTA = 2_500_000


def _jsonl(size: int) -> bytes:
    line = b'{"custom_id":"c","method":"POST","url":"/v1/embeddings","body":{"model":"m","input":"%s"}}\n'
    return line % (b"x" * (size - len(line) + 2))


async def _stream(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 65536):
        yield data[i:i + 65536]


async def _upload(url: str, token: str, data: bytes, *, chunked: bool = False) -> tuple[int, Any]:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", _stream(data) if chunked else io.BytesIO(data), filename="in.jsonl",
                   content_type="application/jsonl")
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(url + "/v1/files", data=form,
                                    headers={"Authorization": f"Bearer {token}"}) as resp:
                return resp.status, jsoncodec.loads(await resp.read())
        except aiohttp.ClientOSError as exc:  # answered and closed while the body was still being sent
            return 0, str(exc)


async def _call(url: str, token: str, method: str, path: str, data: bytes | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/x-ndjson"}
    async with aiohttp.ClientSession() as session, session.request(method, url + path, data=data,
                                                                  headers=headers) as resp:
        return resp.status, jsoncodec.loads(await resp.read())


async def _usage(database_url: str, team: str) -> int:
    conn = await connect(database_url)
    try:
        return int(await conn.fetchval("SELECT minion_team_input_bytes($1)", team))
    finally:
        await conn.close()


def _stored(root: Path) -> list[Path]:
    folder = root / "openai" / "files"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


async def test_uploads_have_the_inputs_cap_and_quota_and_a_delete_gives_room_back(
        database_url: str, tmp_path: Path) -> None:
    services = Services(database_url, tmp_path / "services", extra_env={
        "MINIONS_MAX_INPUT_BYTES": str(CAP), "MINIONS_TEAM_INPUT_QUOTA_BYTES": str(QUOTA)})
    services.workdir.mkdir(parents=True)
    try:
        services.start("api")
        await services.wait_healthy()
        tokens = await tenant_tokens(database_url)
        url, alpha = services.api_url, tokens["alpha"]

        # Over the cap: refused, with or without a Content-Length, and nothing stays in the store.
        for chunked in (False, True):
            status, reply = await _upload(url, alpha, _jsonl(CAP + 100_000), chunked=chunked)
            if status != 0 or not chunked:
                assert status == 413, reply
                assert reply["error"]["code"] == "too_large"
                assert f"{CAP:,} bytes" in reply["error"]["message"]
                assert "MINIONS_MAX_INPUT_BYTES" in reply["error"]["message"]
        assert _stored(services.store_root) == []
        assert await _usage(database_url, "alpha") == 0

        # Within it: stored, and counted against the team's quota.
        size = 900_000
        first = await _upload(url, alpha, _jsonl(size))
        assert first[0] == 200, first
        assert first[1]["bytes"] == size
        assert await _usage(database_url, "alpha") == size
        second = await _upload(url, alpha, _jsonl(size), chunked=True)
        assert second[0] == 200, second
        assert await _usage(database_url, "alpha") == 2 * size

        # The quota is the one of POST /api/v1/inputs: a third file does not fit, nor does an input.
        status, reply = await _upload(url, alpha, _jsonl(size), chunked=True)
        assert status == 413, reply
        assert reply["error"]["code"] == "quota_exceeded"
        assert f"{QUOTA:,}-byte" in reply["error"]["message"]
        status, reply = await _call(url, alpha, "POST", "/api/v1/inputs", b'{"id":1,"ms":0}\n' * 50_000)
        assert status == 413 and reply["error"]["code"] == "quota_exceeded", reply
        assert len(_stored(services.store_root)) == 2
        assert await _usage(database_url, "alpha") == 2 * size
        # Another team's quota is its own.
        status, reply = await _upload(url, tokens["beta"], _jsonl(size))
        assert status == 200, reply
        assert await _usage(database_url, "beta") == size

        # Deleting a file gives its room back: the third upload now fits.
        status, reply = await _call(url, alpha, "DELETE", f"/v1/files/{first[1]['id']}")
        assert status == 200 and reply["deleted"] is True, reply
        assert await _usage(database_url, "alpha") == size
        status, reply = await _upload(url, alpha, _jsonl(size))
        assert status == 200, reply
        assert await _usage(database_url, "alpha") == 2 * size
    except BaseException:
        print(services.logs())
        raise
    finally:
        services.stop_all()
