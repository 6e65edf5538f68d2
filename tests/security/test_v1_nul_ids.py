"""A NUL in `input_file_id` (POST /v1/batches) answered a 422 that
echoed PostgreSQL's encoding error. No /v1 id or text parameter reaches the database holding one now:
a body field is 422 naming the field, an id in a path is 404, a query parameter is 422, and no answer
carries the database's words. A file name is informational: kept, NUL escaped."""

from __future__ import annotations

from typing import Any

import aiohttp
import yarl

from minions import jsoncodec
from minions.nul import NUL_RULE
from minions.testing.processes import Services
from tests.support.tenants import tenant_tokens

DATABASE_WORDS = ("0x00", "UTF8", "invalid byte sequence", "cannot be stored", "encoding")


async def _call(url: str, token: str, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
    async with aiohttp.ClientSession() as session, session.request(
            method, yarl.URL(url + path, encoded=True), headers=headers, **kwargs) as resp:
        return resp.status, jsoncodec.loads(await resp.read())


def _clean(reply: Any) -> None:
    text = jsoncodec.dumps(reply).decode()
    assert not any(word in text for word in DATABASE_WORDS), text


async def test_nul_in_v1_ids_is_a_clear_4xx_without_the_databases_text(services: Services) -> None:
    services.workdir.mkdir(parents=True)
    services.start("api")
    await services.wait_healthy()
    url, token = services.api_url, (await tenant_tokens(services.database_url))["alpha"]

    status, reply = await _call(url, token, "POST", "/v1/batches", json={
        "input_file_id": "file-\x00abc", "endpoint": "/v1/embeddings", "completion_window": "24h"})
    assert status == 422, reply
    assert reply["error"]["fields"] == {"input_file_id": NUL_RULE}
    _clean(reply)

    for path in ("/v1/files/file-%00", "/v1/files/file-%00/content", "/v1/batches/batch_%00"):
        status, reply = await _call(url, token, "GET", path)
        assert status == 404, (path, reply)
        _clean(reply)
    for method, path in (("DELETE", "/v1/files/file-%00"), ("POST", "/v1/batches/batch_%00/cancel")):
        status, reply = await _call(url, token, method, path)
        assert status == 404, (path, reply)
        _clean(reply)
    for path, name in (("/v1/files?after=%00", "after"), ("/v1/files?purpose=b%00", "purpose"),
                       ("/v1/batches?after=x%00", "after")):
        status, reply = await _call(url, token, "GET", path)
        assert status == 422, (path, reply)
        assert reply["error"]["fields"] == {name: NUL_RULE}
        _clean(reply)

    # (A file name with NUL, written the RFC 2231 way: `filename*=UTF-8''in%00put.jsonl`.)
    body = (b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename*=UTF-8''in%00put.jsonl\r\n\r\n"
            b'{"a":1}\n\r\n--b--\r\n')
    status, reply = await _call(url, token, "POST", "/v1/files", data=body,
                                headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert status == 200, reply
    assert reply["filename"] == "in\\u0000put.jsonl"
    assert "database_refused_value" not in services.logs()
