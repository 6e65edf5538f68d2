"""`POST /v1/files` with `Content-Type: multipart/form-data` and no boundary was
a 500. Now it, and every other multipart body that cannot be read, is a 400 `malformed_body`."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from minions import jsoncodec
from minions.testing.processes import Services
from tests.support.tenants import tenant_tokens

GOOD_PART = (b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
             b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n{"a":1}\r\n--b--\r\n')


async def _post(url: str, token: str, content_type: str, body: bytes) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
    async with aiohttp.ClientSession() as session, session.post(url + "/v1/files", data=body,
                                                                headers=headers) as resp:
        raw = await resp.read()
        return resp.status, jsoncodec.loads(raw) if resp.content_type == "application/json" else raw


@pytest.mark.parametrize(("content_type", "body"), [
    ("multipart/form-data", GOOD_PART),                       # no boundary at all
    ("multipart/form-data; boundary=", GOOD_PART),            # an empty one
    ("multipart/form-data; boundary=" + "x" * 100, GOOD_PART),  # longer than RFC 2046's 70
    ("multipart/form-data; boundary=b", b"not multipart at all"),
    ("multipart/form-data; boundary=b", b"--b\r\nno headers end"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nabc"),
])
async def test_an_unreadable_multipart_body_is_a_400(services: Services, content_type: str, body: bytes) -> None:
    services.workdir.mkdir(parents=True)
    services.start("api")
    await services.wait_healthy()
    token = (await tenant_tokens(services.database_url))["alpha"]
    status, reply = await _post(services.api_url, token, content_type, body)
    assert status == 400, reply
    assert reply["error"]["code"] == "malformed_body"
    assert "multipart" in reply["error"]["message"]
    # The same server takes a well-formed upload.
    status, reply = await _post(services.api_url, token, "multipart/form-data; boundary=b", GOOD_PART)
    assert status == 200, reply
    assert "internal_error" not in services.logs() and "unhandled_error" not in services.logs()
