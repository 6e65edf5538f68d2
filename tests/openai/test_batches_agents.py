"""Batches run by real agents, driven by the official `openai` client: embeddings with the bundled
MiniLM equal the native API's vectors (floats and base64 alike), a batch cancelled mid-way delivers
its finished part, and chat completions through the transformers backend on a tiny LM built here
equal the native API's completions, usage counted by the tokenizer."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from minions import jsoncodec
from minions.sample import embedding_records
from minions.testing import tiny_lm
from minions.testing.waiting import eventually
from tests.openai.conftest import MINILM, OpenAICluster, openai_cluster


async def _native(c: OpenAICluster, name: str, kind: str, model: str, records: list[dict[str, Any]],
                  **fields: Any) -> list[dict[str, Any]]:
    await c.native.submit({"team": "search", "project": "native", "name": name, "kind": kind, "model": model,
                           "input": {"records": records}, **fields})

    async def ended() -> bool:
        return (await c.native.task("search", "native", name))["status"] == "completed"

    await eventually(ended, f"native task {name}", 180)
    body = b"".join([chunk async for chunk in c.native.results("search", "native", name)])
    return [jsoncodec.loads(line) for line in body.splitlines()]


async def test_embeddings_batch_equals_the_native_api_and_cancel_delivers_the_finished_part(
        database_url: str, tmp_path: Path) -> None:
    texts = [r["text"] for r in embedding_records(12)]
    lines = [{"custom_id": "several", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MINILM, "input": texts[:3]}},
             {"custom_id": "packed", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": MINILM, "input": texts[3], "encoding_format": "base64"}}]
    lines += [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
               "body": {"model": MINILM, "input": text}} for i, text in enumerate(texts[4:], start=4)]
    async with openai_cluster(database_url, tmp_path) as c:
        # It also advertises a model it cannot load: that batch's requests fail on the executor.
        c.fleet.start("emb", "--threads", "1", "--model", "no-such-org/no-such-model", kinds=("embedding",))
        await c.registered("emb")
        client = c.client()
        file_id = await c.upload(client, lines)
        batch = await c.call(client.batches.create, input_file_id=file_id, endpoint="/v1/embeddings",
                             completion_window="24h", metadata={"project": "pipeline"})
        assert batch.status == "in_progress" and batch.request_counts.total == 10
        batch = await c.batch_until(client, batch.id, "completed")
        assert batch.request_counts.model_dump() == {"total": 10, "completed": 10, "failed": 0}
        assert batch.error_file_id is None and batch.completed_at >= batch.in_progress_at
        output = await c.jsonl(client, batch.output_file_id)
        # The same records in the same order through the native API: the same subtask, the same vectors.
        native = await _native(c, "emb", "embedding", MINILM, [{"id": str(i), "text": t} for i, t in enumerate(texts)])

        assert [o["custom_id"] for o in output] == [line["custom_id"] for line in lines]
        for o in output:
            assert o["error"] is None and o["response"]["status_code"] == 200 and o["response"]["request_id"]
            assert o["response"]["body"]["object"] == "list" and o["response"]["body"]["model"] == MINILM
        several = output[0]["response"]["body"]
        assert [d["index"] for d in several["data"]] == [0, 1, 2]
        assert [d["embedding"] for d in several["data"]] == [n["embedding"] for n in native[:3]]
        assert several["usage"]["prompt_tokens"] == several["usage"]["total_tokens"] > 3 * 2
        packed = base64.b64decode(output[1]["response"]["body"]["data"][0]["embedding"])
        assert np.array_equal(np.frombuffer(packed, dtype="<f4"), np.asarray(native[3]["embedding"], dtype=np.float32))
        assert [o["response"]["body"]["data"][0]["embedding"] for o in output[2:]] == [
            n["embedding"] for n in native[4:]]

        # The native results as one array (?format=npy): the same float32 numbers, in input order.
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c.admin}"}) as http:
            url = f"{c.services.api_url}/api/v1/tasks/search/native/emb/results"
            async with http.get(url, params={"format": "npy"}) as r:
                assert r.status == 200 and r.content_type == "application/octet-stream"
                array = np.load(io.BytesIO(await r.read()))
            async with http.get(url, params={"format": "xml"}) as r:
                assert r.status == 422
        assert array.dtype == np.dtype("<f4") and array.shape == (12, 384)
        assert np.array_equal(array, np.asarray([n["embedding"] for n in native], dtype=np.float32))

        # Requests the executor fails go to the error file; the batch still completes.
        broken = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/embeddings",
                   "body": {"model": "no-such-org/no-such-model", "input": t}} for i, t in enumerate(texts[:2])]
        batch = await c.call(client.batches.create, input_file_id=await c.upload(client, broken),
                             endpoint="/v1/embeddings", completion_window="24h")
        batch = await c.batch_until(client, batch.id, "completed")
        assert batch.request_counts.model_dump() == {"total": 2, "completed": 0, "failed": 2}
        assert batch.output_file_id is None
        errors = await c.jsonl(client, batch.error_file_id)
        assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in errors] == [
            ("b0", "server_error", None), ("b1", "server_error", None)]
        assert all("no-such-model" in e["error"]["message"] for e in errors), errors

        # Cancel mid-batch: 1,500 requests are three subtasks; cancel once the first is done.
        many = [{"custom_id": f"m{i}", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": MINILM, "input": r["text"]}} for i, r in enumerate(embedding_records(1500))]
        batch = await c.call(client.batches.create, input_file_id=await c.upload(client, many),
                             endpoint="/v1/embeddings", completion_window="24h")

        async def first_part_done() -> Any:
            b = await c.call(client.batches.retrieve, batch.id)
            return b if b.request_counts.completed >= 500 else None

        await eventually(first_part_done, "the first subtask to commit", 180, interval_s=0.2)
        cancelling = await c.call(client.batches.cancel, batch.id)
        assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
        batch = await c.batch_until(client, batch.id, "cancelled")
        done, failed = batch.request_counts.completed, batch.request_counts.failed
        assert 500 <= done < 1500 and done + failed == 1500
        output = await c.jsonl(client, batch.output_file_id)
        errors = await c.jsonl(client, batch.error_file_id)
        assert len(output) == done and len(errors) == failed
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        assert sorted(int(o["custom_id"][1:]) for o in output + errors) == list(range(1500))


async def test_chat_completions_batch_through_the_transformers_backend(database_url: str, tmp_path: Path) -> None:
    model = str(await asyncio.to_thread(tiny_lm.build, tmp_path / "tiny", tiny_lm.CHAT_TEMPLATE))
    conversations = [[{"role": "user", "content": "why is the machine idle"}],
                     [{"role": "system", "content": "answer fast"}, {"role": "user", "content": "what is a lease"}],
                     [{"role": "user", "content": [{"type": "text", "text": "the model "},
                                                   {"type": "text", "text": "answers"}]}]]
    lines = [{"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": model, "messages": m, "max_tokens": 8, "temperature": 0}}
             for i, m in enumerate(conversations)]
    async with openai_cluster(database_url, tmp_path) as c:
        c.fleet.start("lm", "--threads", "1", "--completion-backend", "transformers", "--model", model,
                      kinds=("completion",))
        await c.registered("lm")
        client = c.client()
        batch = await c.call(client.batches.create, input_file_id=await c.upload(client, lines),
                             endpoint="/v1/chat/completions", completion_window="24h")
        batch = await c.batch_until(client, batch.id, "completed")
        output = await c.jsonl(client, batch.output_file_id)
        flat = [conversations[0], conversations[1], [{"role": "user", "content": "the model answers"}]]
        native = await _native(c, "chat", "completion", model,
                               [{"id": str(i), "messages": m} for i, m in enumerate(flat)],
                               params={"max_tokens": 8, "temperature": 0})
        # The interactive lane, on the same executor: the same completion, synchronously.
        interactive = await c.call(client.chat.completions.create, model=model, messages=conversations[1],
                                   max_tokens=8, temperature=0)

    assert interactive.object == "chat.completion" and interactive.choices[0].message.role == "assistant"
    assert interactive.choices[0].message.content == native[1]["text"]
    assert interactive.usage.completion_tokens == native[1]["usage"]["completion_tokens"]

    assert batch.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert [o["custom_id"] for o in output] == ["chat-0", "chat-1", "chat-2"]
    for o, n in zip(output, native, strict=True):
        body = o["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == model and body["id"].startswith("chatcmpl-")
        choice = body["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": n["text"], "refusal": None}
        assert choice["finish_reason"] == ("length" if n["usage"]["completion_tokens"] >= 8 else "stop")
        usage = body["usage"]
        assert usage["prompt_tokens"] == n["usage"]["prompt_tokens"] > 0
        assert usage["completion_tokens"] == n["usage"]["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
