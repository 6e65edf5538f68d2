"""The models the pool knows (every model an executor has ever advertised) decide how /v1 answers a
model no executor serves now: GET /v1/models lists them; the interactive lane answers 404
`model_not_found` (OpenAI's answer, which the official client raises as NotFoundError and does not
retry) for a model never advertised, 503 with Retry-After for a known one whose executors are away;
a batch of a known model is accepted and waits, one of a model never advertised fails at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
from openai import OpenAI

from minions import jsoncodec
from tests.openai.conftest import MINILM, OpenAICluster, openai_cluster


async def _executor(c: OpenAICluster, action: str, body: dict[str, Any] | None = None,
                    executor_id: str | None = None) -> dict[str, Any]:
    """The executor protocol, spoken directly: an executor that registers and leaves, never claiming."""
    path = "register" if executor_id is None else f"{executor_id}/{action}"
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c.executor_token}"}) as http, \
            http.post(f"{c.services.api_url}/api/v1/executors/{path}", json=body or {}) as r:
        assert r.status < 300, await r.text()
        answer: dict[str, Any] = jsoncodec.loads(await r.read())
        return answer


def _counting_client(c: OpenAICluster, sent: list[str]) -> OpenAI:
    """The official client with its default retries (2), counting the requests it sends."""
    http = httpx.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    return OpenAI(base_url=f"{c.services.api_url}/v1", api_key=c.admin, http_client=http)


async def test_models_known_decide_404_503_and_whether_a_batch_waits(database_url: str, tmp_path: Path) -> None:
    async with openai_cluster(database_url, tmp_path) as c:
        client = c.client()
        assert (await c.call(client.models.list)).data == []

        # Never advertised: 404 model_not_found in OpenAI's shape, raised as NotFoundError, sent once.
        sent: list[str] = []
        with pytest.raises(openai.NotFoundError) as missing:
            await c.call(_counting_client(c, sent).embeddings.create, model=MINILM, input="hello")
        assert sent == ["/v1/embeddings"]  # not retried
        error = missing.value.body
        assert isinstance(error, dict)
        assert (error["code"], error["type"], error["param"]) == ("model_not_found", "invalid_request_error",
                                                                  "model")
        assert f"no executor serves embedding with model {MINILM!r}" in error["message"]
        with pytest.raises(openai.NotFoundError):
            await c.call(client.models.retrieve, MINILM)

        # Advertised once (it also serves a model whose name holds ':', as Ollama's do): known from then on.
        registered = await _executor(c, "register", {"name": "mac-1", "hardware": {},
                                                     "kinds": ["embedding", "completion"],
                                                     "models": [MINILM, "llama3:8b"]})
        models = await c.call(client.models.list)
        assert [(m.id, m.object, m.owned_by) for m in models.data] == [
            ("llama3:8b", "model", "minions"), (MINILM, "model", "minions")]
        listed = {m.id: m.model_dump() for m in models.data}
        assert listed[MINILM]["kinds"] == ["completion", "embedding"] and listed[MINILM]["online"] is True
        assert isinstance(listed[MINILM]["created"], int) and listed[MINILM]["created"] > 1_700_000_000
        one = await c.call(client.models.retrieve, MINILM)  # a name with '/', sent as %2F by the client
        assert one.id == MINILM and one.model_dump()["kinds"] == ["completion", "embedding"]
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c.admin}"}) as http:
            async with http.get(f"{c.services.api_url}/v1/models/{MINILM}") as r:  # and as a plain '/'
                assert r.status == 200 and (await r.json())["id"] == MINILM
            async with http.get(f"{c.services.api_url}/v1/models/no-such/model") as r:
                assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"

        # It leaves (a Mac that sleeps): the model stays known, not online; the lane answers 503 at once.
        await _executor(c, "deregister", executor_id=registered["executor_id"])
        assert (await c.call(client.models.retrieve, MINILM)).model_dump()["online"] is False
        with pytest.raises(openai.APIStatusError) as away:
            await c.call(client.embeddings.create, model=MINILM, input="hello")
        assert away.value.status_code == 503 and int(away.value.response.headers["Retry-After"]) > 0
        assert isinstance(away.value.body, dict) and away.value.body["code"] == "no_executor"

        # A batch of the known model waits (in_progress, its task open); one never advertised fails.
        line = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": MINILM, "input": "x"}}
        batch = await c.call(client.batches.create, input_file_id=await c.upload(client, [line]),
                             endpoint="/v1/embeddings", completion_window="24h")
        assert batch.status == "in_progress"
        status = await c.conn.fetchval("SELECT status FROM tasks WHERE name = $1", batch.id)
        assert status in ("submitted", "splitting", "queued"), status
        unknown = {**line, "body": {"model": "no-such-org/no-such-model", "input": "x"}}
        batch = await c.call(client.batches.create, input_file_id=await c.upload(client, [unknown]),
                             endpoint="/v1/embeddings", completion_window="24h")
        assert batch.status == "failed" and batch.errors is not None
        assert [(e.line, e.code) for e in batch.errors.data] == [(1, "model_not_found")]
        assert "no executor serves embedding with model 'no-such-org/no-such-model'" in batch.errors.data[0].message
