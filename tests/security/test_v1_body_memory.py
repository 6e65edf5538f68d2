"""A JSON body on /v1 costs the API memory in proportion to its size, not ~70x it.

`POST /v1/embeddings` with `{"input": ["a", "a", ...]}` of 12.5 MB took a worker from 85 MB to
916 MB before its 422; a 12.5 MB line of a batch input file, 1,253 MB. Now a /v1 body is capped in
bytes (MINIONS_OPENAI_MAX_REQUEST_BYTES, 413 before it is read), and one within the cap, or a batch
line, is counted (values, inputs) before it is decoded. Measured on the real API process from /proc
(VmHWM, reset with clear_refs), as tests/security/test_inline_memory.py does."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from minions import jsoncodec
from minions.config import Settings
from minions.testing.processes import Services
from tests.security.test_inline_memory import _reset_peak, _rss, _settle
from tests.support.tenants import tenant_tokens

MB = 1 << 20
LIMIT = Settings.openai_max_request_bytes  # the default cap


def _embeddings_body(size: int) -> bytes:
    """`{"model", "input": ["a", "a", ...]}` of about `size` bytes: the worst case of memory per byte."""
    count = (size - 40) // 4
    return b'{"model":"m","input":[' + b",".join([b'"a"'] * count) + b"]}"


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 1 << 16):
        yield data[i:i + (1 << 16)]


async def _post(url: str, token: str, path: str, body: Any, *, chunked: bool = False) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        try:
            async with session.post(url + path, data=_chunks(body) if chunked else body, headers=headers) as resp:
                return resp.status, jsoncodec.loads(await resp.read())
        except aiohttp.ClientOSError as exc:  # the server answered and closed while the body was being sent
            return 0, str(exc)


async def _api(services: Services) -> tuple[int, dict[str, str]]:
    services.workdir.mkdir(parents=True)
    api = services.start("api")
    await services.wait_healthy()
    assert api.process is not None
    tokens = await tenant_tokens(services.database_url)
    # Warm every path the big requests take (threads, decoders, the store) with a small one.
    status, reply = await _post(services.api_url, tokens["alpha"], "/v1/embeddings", _embeddings_body(2 * MB))
    assert status == 422, reply
    return api.process.pid, tokens


async def _peak_of(pid: int, call: Any) -> tuple[Any, int]:
    """The call's result, and how far the process's peak RSS rose above its settled RSS during it."""
    baseline = await _settle(pid)
    _reset_peak(pid)
    result = await call
    return result, _rss(pid, "VmHWM") - baseline


async def test_a_15mb_embeddings_body_is_refused_within_4x_its_size(services: Services) -> None:
    pid, tokens = await _api(services)
    body = _embeddings_body(15 * MB)
    for chunked in (False, True):  # with a Content-Length (refused unread), and without (read up to the cap)
        (status, reply), grown = await _peak_of(pid, _post(services.api_url, tokens["alpha"], "/v1/embeddings",
                                                            body, chunked=chunked))
        assert grown < 4 * len(body), (
            f"peak RSS rose {grown / MB:.0f} MB for a {len(body) / MB:.0f} MB body (chunked={chunked}; limit 4x)")
        if status != 0:  # (a client still sending may see the connection closed instead of the answer)
            assert status == 413, reply
            assert reply["error"]["code"] == "too_large"
            assert f"{LIMIT:,} bytes" in reply["error"]["message"]
            assert "MINIONS_OPENAI_MAX_REQUEST_BYTES" in reply["error"]["message"]
    # The answer itself, once the body is sent whole before it is read (a client that waits).
    status, reply = await _post(services.api_url, tokens["alpha"], "/v1/embeddings", body[:LIMIT + 1], chunked=True)
    assert status == 413, reply


async def test_inputs_are_counted_before_they_are_built(services: Services) -> None:
    """Within the byte cap, a million inputs: refused at the 2049th, not after a list of a million."""
    pid, tokens = await _api(services)
    body = _embeddings_body(LIMIT - 1024)
    (status, reply), grown = await _peak_of(pid, _post(services.api_url, tokens["alpha"], "/v1/embeddings", body))
    assert status == 422, reply
    assert reply["error"]["fields"] == {"input": "at most 2048 inputs per request"}
    assert grown < 4 * len(body), f"peak RSS rose {grown / MB:.0f} MB for a {len(body) / MB:.1f} MB body"
    # So are the values of any other body (a chat of 100,000 one-letter messages: 300,000 values).
    chat = jsoncodec.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}] * 100_000})
    status, reply = await _post(services.api_url, tokens["alpha"], "/v1/chat/completions", chat)
    assert status == 422, reply
    assert "JSON values" in reply["error"]["fields"]["body"]


async def _upload(url: str, token: str, data: bytes) -> dict[str, Any]:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", io.BytesIO(data), filename="input.jsonl", content_type="application/jsonl")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session, session.post(
            url + "/v1/files", data=form, headers={"Authorization": f"Bearer {token}"}) as resp:
        reply = jsoncodec.loads(await resp.read())
        assert resp.status == 200, reply
        return reply  # type: ignore[no-any-return]


def _line(custom_id: str, body: bytes) -> bytes:
    return (b'{"custom_id":"%s","method":"POST","url":"/v1/embeddings","body":' % custom_id.encode()) + body + b"}\n"


async def test_a_long_batch_line_fails_its_batch_without_being_held(services: Services) -> None:
    """A 12.5 MB line: the batch fails validation with `line_too_long` on that line,
    and the API never holds more than a small multiple of the cap; a line within the cap holding a
    million inputs is refused at the 2049th."""
    pid, tokens = await _api(services)
    long_line = _line("long", _embeddings_body(int(12.5 * MB)))
    many_inputs = _line("many", _embeddings_body(LIMIT - 1024))
    fine = _line("fine", b'{"model":"m","input":["a","b"]}')
    uploaded = await _upload(services.api_url, tokens["alpha"], fine + long_line + many_inputs + fine)
    create = {"input_file_id": uploaded["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}
    (status, batch), grown = await _peak_of(pid, _post(services.api_url, tokens["alpha"], "/v1/batches",
                                                       jsoncodec.dumps(create)))
    assert status == 200, batch
    assert batch["status"] == "failed"
    errors = {e["line"]: e for e in batch["errors"]["data"]}
    assert errors[2]["code"] == "line_too_long", errors
    assert f"{len(long_line) - 1:,} bytes" in errors[2]["message"]
    assert "MINIONS_OPENAI_MAX_REQUEST_BYTES" in errors[2]["message"]
    assert errors[3]["message"] == "at most 2048 inputs per request" and errors[3]["param"] == "body.input"
    assert errors[4]["code"] == "duplicate_custom_id"
    assert errors[1]["code"] == "model_not_found"  # (no executor here): the good lines were read through
    assert set(errors) == {1, 2, 3, 4}
    assert grown < 4 * LIMIT, f"peak RSS rose {grown / MB:.0f} MB validating a file of 12.5 MB and 4 MB lines"


async def test_a_batch_body_is_small(services: Services) -> None:
    _, tokens = await _api(services)
    body = jsoncodec.dumps({"input_file_id": "file-x", "endpoint": "/v1/embeddings", "completion_window": "24h",
                            "padding": "x" * (1 << 20)})
    status, reply = await _post(services.api_url, tokens["alpha"], "/v1/batches", body)
    assert status in (0, 413), reply
    status, reply = await _post(services.api_url, tokens["alpha"], "/v1/batches", body, chunked=True)
    assert status in (0, 413), reply
