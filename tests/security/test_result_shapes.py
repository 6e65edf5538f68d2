"""Results checked by shape, per kind, at complete; every reader relies on it.

Complete refuses (422 `output_mismatch`, naming the line and the field; nothing committed, the lease
still live) an embedding that is not a list of float32 numbers or not as long as the task's other
vectors, a completion whose text is not a string, token counts that are not non-negative integers,
and a line that repeats a key. A result committed before that check (written here straight into the
database, as such an old row would be) breaks no reader: `?format=npy` answers 409 or breaks off at
once, result parts and the SDK raise a clear error, the OpenAI finalizer fails that request and ends
the batch, the interactive lane answers 502 `malformed_result`; never a 500, never a hang.

An API in this process on a real PostgreSQL and a local store; an executor driven by hand over HTTP."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from minions import jsoncodec
from minions.db.connect import connect
from minions.result_parts import compact_completed
from minions.sdk import MinionsClient
from minions.sdk.objects import UnknownResult
from minions.services.api.appkeys import STORE
from minions.services.splitter.split import split_task
from tests.support.api import ApiHarness, Reply, running_api

EMBEDDER = "test/embedder"
WRITER = "test/writer"
TIMEOUT_S = 20.0  # any read below that would hang is cut off here, and fails the test


@pytest.fixture
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[ApiHarness]:
    async with running_api(database_url, tmp_path / "store") as harness:
        yield harness


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await connect(database_url)
    yield connection
    await connection.close()


def vector(dims: int, value: float = 0.5) -> list[float]:
    return [value] * dims


async def submit(api: ApiHarness, name: str, kind: str, records: list[dict[str, Any]], size: int) -> None:
    reply = await api.call("POST", "/api/v1/tasks", json={
        "team": "search", "project": "shapes", "name": name, "kind": kind, "subtask_size": size,
        "model": EMBEDDER if kind == "embedding" else WRITER, "input": {"records": records}})
    assert reply.status == 201, reply.body


async def executor(api: ApiHarness, name: str) -> str:
    return await api.register(name, kinds=["embedding", "completion"], models=[EMBEDDER, WRITER])


async def claim(api: ApiHarness, executor_id: str) -> dict[str, Any]:
    for _ in range(10):
        reply = await api.call("POST", f"/api/v1/executors/{executor_id}/claim?wait=2", token="executor")
        if reply.status == 200:
            lease: dict[str, Any] = reply.body
            return lease
        assert reply.status == 204, reply.body
    raise AssertionError("nothing to claim")


def ids_of(lease: dict[str, Any]) -> list[Any]:
    return [jsoncodec.loads(line)["id"] for line in lease["subtask"]["input"]["data"].splitlines() if line.strip()]


def jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(jsoncodec.dumps_line(r) for r in records)


async def complete(api: ApiHarness, lease: dict[str, Any], output: bytes) -> Reply:
    return await api.call("POST", f"/api/v1/leases/{lease['lease']['token']}/complete", token="executor",
                          json={"records": lease["subtask"]["input"]["records"], "seconds": 0.1,
                                "output": output.decode()})


async def lease_state(api: ApiHarness, executor_id: str, lease: dict[str, Any]) -> str:
    token = lease["lease"]["token"]
    reply = await api.call("POST", f"/api/v1/executors/{executor_id}/heartbeat", token="executor",
                           json={"leases": [token]})
    state: str = reply.body["leases"][token]
    return state


async def commit_as_old_row(conn: asyncpg.Connection, lease: dict[str, Any], output: bytes) -> None:
    """Commit `output` as a complete did before results were checked by shape: straight through the
    complete's SQL, which takes the bytes it is given."""
    verdict = await conn.fetchval("SELECT minion_complete($1, $2, 0.1, NULL, $3, $4, $5)", lease["lease"]["token"],
                                  lease["subtask"]["input"]["records"], hashlib.sha256(output).digest(), len(output),
                                  output)
    assert verdict == "ok"


async def task_status(api: ApiHarness, name: str) -> str:
    status: str = (await api.call("GET", f"/api/v1/tasks/search/shapes/{name}")).body["status"]
    return status


# ---------------------------------------------------------------- complete


def _embedding_outputs(ids: list[Any]) -> dict[str, tuple[bytes, str]]:
    good = [{"id": i, "embedding": vector(4), "usage": {"prompt_tokens": 3}} for i in ids]

    def changed(n: int, **fields: Any) -> bytes:
        return jsonl([{**r, **fields} if k == n else r for k, r in enumerate(good)])

    return {
        "strings": (changed(1, embedding=["0.5"] * 4), "output line 2: `embedding[0]` must be a number, not a string"),
        "no vector": (jsonl([{"id": r["id"]} if k == 2 else r for k, r in enumerate(good)]),
                      "output line 3: `embedding` missing"),
        "overflow": (changed(0, embedding=[1e308] * 4),
                     "output line 1: `embedding[0]` is 1e+308: not a finite float32"),
        "short vector": (changed(2, embedding=vector(3)), "output line 3: `embedding` has 3 dimensions"),
        "booleans": (changed(1, embedding=[True] * 4), "output line 2: `embedding[0]` must be a number, not a boolean"),
        "negative tokens": (changed(1, usage={"prompt_tokens": -3}), "output line 2: `usage.prompt_tokens`"),
        "a key twice": (jsonl(good[:2]) + jsoncodec.dumps_line(good[2])[:-2] + b',"id":9}\n',
                        'output line 3 repeats the key "id"'),
        "error and vector": (changed(0, error="oom"), "output line 1: `embedding` beside an `error`"),
    }


async def test_complete_refuses_results_of_the_wrong_shape_and_keeps_the_lease(api: ApiHarness) -> None:
    await submit(api, "emb", "embedding", [{"id": f"r{i}", "text": "t"} for i in range(6)], size=3)
    executor_id = await executor(api, "shapes")
    first, second = await claim(api, executor_id), await claim(api, executor_id)
    for what, (output, says) in _embedding_outputs(ids_of(first)).items():
        reply = await complete(api, first, output)
        assert reply.status == 422 and reply.error["code"] == "output_mismatch", (what, reply.body)
        assert says in reply.error["message"], (what, reply.error["message"])
        assert await lease_state(api, executor_id, first) == "ok", what  # nothing committed, still live
    good = [{"id": i, "embedding": vector(4), "usage": {"prompt_tokens": 3}} for i in ids_of(first)]
    assert (await complete(api, first, jsonl(good))).status == 200

    # The first committed vectors fixed the task's length: another output's are refused, singly and
    # batched, and its lease stays live.
    wrong = jsonl([{"id": i, "embedding": vector(5)} for i in ids_of(second)])
    reply = await complete(api, second, wrong)
    assert reply.status == 422 and reply.error["code"] == "output_mismatch", reply.body
    assert "output line 1: `embedding` has 5 dimensions; the task's results have 4" in reply.error["message"]
    batched = await api.call("POST", "/api/v1/leases/complete", token="executor", json={"leases": [
        {"token": second["lease"]["token"], "records": 3, "seconds": 0.1, "output": wrong.decode()}]})
    assert batched.status == 200 and batched.body["results"][0]["status"] == 422, batched.body
    assert batched.body["results"][0]["error"]["code"] == "output_mismatch"
    assert await lease_state(api, executor_id, second) == "ok"
    assert await task_status(api, "emb") == "running"
    right = jsonl([{"id": i, "embedding": vector(4, 0.25)} for i in ids_of(second)])
    assert (await complete(api, second, right)).status == 200
    assert await task_status(api, "emb") == "completed"


async def test_complete_refuses_a_completion_of_the_wrong_shape(api: ApiHarness) -> None:
    await submit(api, "done", "completion", [{"id": i, "prompt": "p"} for i in range(2)], size=2)
    executor_id = await executor(api, "writer")
    lease = await claim(api, executor_id)
    for records, says in [
        ([{"id": 0, "text": "a"}, {"id": 1, "text": 42}], "output line 2: `text` must be a string, not a number"),
        ([{"id": 0, "text": "a"}, {"id": 1}], "output line 2: `text` missing"),
        ([{"id": 0, "text": "a", "usage": {"completion_tokens": "2"}}, {"id": 1, "text": "b"}],
         "output line 1: `usage.completion_tokens` must be a non-negative integer, not a string"),
    ]:
        reply = await complete(api, lease, jsonl(records))
        assert reply.status == 422 and reply.error["code"] == "output_mismatch" and says in reply.error["message"], \
            reply.body
        assert await lease_state(api, executor_id, lease) == "ok"
    good = [{"id": i, "text": f"t{i}", "usage": {"prompt_tokens": 1, "completion_tokens": 1}} for i in range(2)]
    assert (await complete(api, lease, jsonl(good))).status == 200


# ---------------------------------------------------------------- readers of an old row


async def _read(api: ApiHarness, path: str) -> tuple[int, bytes, Exception | None]:
    """(status, the bytes received, the error that ended the body early, if one did), in TIMEOUT_S."""
    received = bytearray()
    async with asyncio.timeout(TIMEOUT_S), api.session.get(
            api.url + path, headers={"Authorization": f"Bearer {api.admin}"}) as resp:
        try:
            async for chunk in resp.content.iter_any():
                received += chunk
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
            return resp.status, bytes(received), exc
        return resp.status, bytes(received), None


async def _old_embedding_task(api: ApiHarness, conn: asyncpg.Connection, name: str, records: int,
                              bad_line: int, bad: dict[str, Any]) -> None:
    """A completed embedding task of one subtask whose result line `bad_line` (1-based) is `bad`."""
    await submit(api, name, "embedding", [{"id": i, "text": "t"} for i in range(records)], size=records)
    lease = await claim(api, await executor(api, f"old-{name}"))
    lines = [{"id": i, "embedding": vector(4)} for i in ids_of(lease)]
    lines[bad_line - 1] = {"id": lines[bad_line - 1]["id"], **bad}
    await commit_as_old_row(conn, lease, jsonl(lines))
    assert await task_status(api, name) == "completed"


@pytest.mark.parametrize(("bad", "says"), [
    ({"embedding": ["0.5", "0.5", "0.5", "0.5"]}, "record 2 of the results: `embedding[0]` must be a number"),
    ({}, "record 2 of the results: `embedding` missing"),
    ({"embedding": vector(3)}, "record 2 of the results: `embedding` has 3 dimensions"),
    ({"embedding": [1e308] * 4}, "`embedding[0]` is 1e+308: not a finite float32"),
])
async def test_npy_of_a_malformed_old_result_is_a_clear_409(api: ApiHarness, conn: asyncpg.Connection,
                                                            bad: dict[str, Any], says: str) -> None:
    await _old_embedding_task(api, conn, "small", 3, 2, bad)
    status, body, broken = await _read(api, "/api/v1/tasks/search/shapes/small/results?format=npy")
    assert (status, broken) == (409, None)
    error = jsoncodec.loads(body)["error"]
    assert error["code"] == "malformed_result" and says in error["message"], error


async def test_npy_breaks_off_at_once_at_a_malformed_line_past_its_first_block(
        api: ApiHarness, conn: asyncpg.Connection) -> None:
    """Past the first block the status line is sent: the response ends early (fewer bytes than its
    Content-Length), so the client fails at once instead of waiting for bytes that never come."""
    await _old_embedding_task(api, conn, "large", 1500, 1400, {"embedding": ["x"] * 4})
    status, body, broken = await _read(api, "/api/v1/tasks/search/shapes/large/results?format=npy")
    assert status == 200 and broken is not None
    assert len(body) < 128 + 1500 * 4 * 4


async def test_result_parts_and_the_sdk_give_a_clear_error_for_a_malformed_old_result(
        api: ApiHarness, conn: asyncpg.Connection) -> None:
    await _old_embedding_task(api, conn, "parts", 3, 3, {"embedding": "0.5 0.5 0.5 0.5"})
    [compaction] = await compact_completed(conn, api.app[STORE], part_bytes=1 << 20)
    assert compaction.done
    listing = await api.call("GET", "/api/v1/tasks/search/shapes/parts/results?format=parts")
    assert listing.status == 200 and listing.body["compacted"]
    # The parts hold the bytes committed (compaction copies, it does not judge); their readers judge.
    status, body, _ = await _read(api, "/api/v1/tasks/search/shapes/parts/results?format=npy")
    assert status == 409 and "record 3 of the results: `embedding` must be a non-empty list of numbers" in \
        jsoncodec.loads(body)["error"]["message"]
    client = MinionsClient(api.url, api.admin)
    try:
        with pytest.raises(UnknownResult, match="record 2: `embedding` must be a non-empty list of numbers"):
            async with asyncio.timeout(TIMEOUT_S):
                [r async for r in client.iter_results("search/shapes/parts")]
    finally:
        await client.close()


async def _batch(api: ApiHarness, conn: asyncpg.Connection, endpoint: str, bodies: list[dict[str, Any]]) -> str:
    """A /v1 batch of `bodies`, created through the API and split; its id."""
    lines = b"".join(jsoncodec.dumps_line({"custom_id": f"req-{n}", "method": "POST", "url": endpoint, "body": b})
                     for n, b in enumerate(bodies))
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", lines, filename="in.jsonl", content_type="application/jsonl")
    async with api.session.post(api.url + "/v1/files", data=form,
                                headers={"Authorization": f"Bearer {api.admin}"}) as resp:
        assert resp.status == 200, await resp.text()
        file_id = (await resp.json())["id"]
    reply = await api.call("POST", "/v1/batches", json={"input_file_id": file_id, "endpoint": endpoint,
                                                          "completion_window": "24h"})
    assert reply.status == 200, reply.body
    batch_id: str = reply.body["id"]
    task_id = await conn.fetchval("SELECT task_id FROM openai_batches WHERE id = $1", batch_id)
    await split_task(conn, api.app[STORE], task_id)
    return batch_id


async def test_the_openai_finalizer_fails_the_malformed_request_and_ends_the_batch(
        api: ApiHarness, conn: asyncpg.Connection) -> None:
    """Before: KeyError in the finalizer; the batch stayed `finalizing`, retaken every 600 s."""
    executor_id = await executor(api, "batcher")  # a batch names a model some executor serves
    batch_id = await _batch(api, conn, "/v1/embeddings",
                            [{"model": EMBEDDER, "input": "a"}, {"model": EMBEDDER, "input": "b"},
                             {"model": EMBEDDER, "input": "c"}])
    lease = await claim(api, executor_id)
    ids = ids_of(lease)
    assert len(ids) == 3
    await commit_as_old_row(conn, lease, jsonl([{"id": ids[0], "embedding": vector(4)}, {"id": ids[1]},
                                                {"id": ids[2], "embedding": ["x"]}]))

    async def ended() -> dict[str, Any]:
        while True:
            batch = (await api.call("GET", f"/v1/batches/{batch_id}")).body
            if batch["status"] not in ("validating", "in_progress", "finalizing"):
                return dict(batch)
            await asyncio.sleep(0.2)

    async with asyncio.timeout(TIMEOUT_S):
        batch = await ended()
    assert batch["status"] == "completed" and batch["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    content = await api.call("GET", f"/v1/files/{batch['error_file_id']}/content")
    failed = {e["custom_id"]: e["error"] for e in map(jsoncodec.loads, content.body.splitlines())}
    assert failed["req-1"]["code"] == "malformed_result" and "`embedding` missing" in failed["req-1"]["message"]
    assert "`embedding[0]` must be a number, not a string" in failed["req-2"]["message"]
    output = await api.call("GET", f"/v1/files/{batch['output_file_id']}/content")
    [ok] = map(jsoncodec.loads, output.body.splitlines())
    assert ok["custom_id"] == "req-0" and ok["response"]["body"]["data"][0]["embedding"] == vector(4)


@pytest.mark.parametrize(("endpoint", "body", "result", "says"), [
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["a", "b"]}, [{"embedding": vector(4)}, {}],
     "`embedding` missing"),
    ("/v1/embeddings", {"model": EMBEDDER, "input": ["a", "b"], "encoding_format": "base64"},
     [{"embedding": vector(4)}, {"embedding": ["1", "2", "3", "4"]}], "`embedding[0]` must be a number"),
    ("/v1/chat/completions", {"model": WRITER, "messages": [{"role": "user", "content": "hi"}]}, [{}],
     "`text` missing"),
    ("/v1/completions", {"model": WRITER, "prompt": "hi"}, [{"text": "x", "usage": {"completion_tokens": "1"}}],
     "`usage.completion_tokens` must be a non-negative integer"),
])
async def test_the_interactive_lane_answers_502_for_a_malformed_result(
        api: ApiHarness, conn: asyncpg.Connection, endpoint: str, body: dict[str, Any],
        result: list[dict[str, Any]], says: str) -> None:
    """Before: 500 (KeyError, or a string in a float32 array)."""
    executor_id = await executor(api, "interactive")
    asked = asyncio.create_task(api.call("POST", endpoint, json=body))
    lease = await claim(api, executor_id)
    await commit_as_old_row(conn, lease, jsonl([{"id": i, **r} for i, r in zip(ids_of(lease), result, strict=True)]))
    async with asyncio.timeout(TIMEOUT_S):
        reply = await asked
    assert reply.status == 502 and reply.error["code"] == "malformed_result", reply.body
    assert says in reply.error["message"], reply.error
