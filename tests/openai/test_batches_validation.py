"""Batches that need no agent to judge: an input file with bad lines fails with line numbers, a
window that passes expires the batch, listing pages with after/limit, files round-trip."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from minions.testing.factories import make_token
from tests.openai.conftest import MINILM, OpenAICluster, openai_cluster


def _line(custom_id: str, text: str = "hello", **overrides: object) -> dict[str, object]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": MINILM, "input": text}, **overrides}


async def _register_executor(c: OpenAICluster) -> None:
    """An executor that serves MiniLM embeddings but never claims: batches queue and wait."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c.executor_token}"}) as http:
        async with http.post(f"{c.services.api_url}/api/v1/executors/register",
                             json={"name": "idle", "hardware": {}, "kinds": ["embedding"], "models": [MINILM]}) as r:
            assert r.status == 201, await r.text()


async def test_bad_lines_fail_the_batch_with_their_line_numbers(database_url: str, tmp_path: Path) -> None:
    async with openai_cluster(database_url, tmp_path) as c:
        await _register_executor(c)
        client = c.client()
        file_id = await c.upload(client, [
            _line("a"),
            b'{"custom_id": "b", "method": "POST", \n',                       # 2: bad JSON
            _line("c", url="/v1/chat/completions"),                            # 3: wrong url
            _line("a"),                                                        # 4: custom_id used twice
            b"\n",                                                             # 5: blank, skipped
            _line("e", body={"model": MINILM, "input": "x", "dimensions": 3}),  # 6: unsupported parameter
        ])
        batch = await c.call(client.batches.create, input_file_id=file_id, endpoint="/v1/embeddings",
                             completion_window="24h")
        assert batch.status == "failed" and batch.failed_at is not None
        assert batch.output_file_id is None and batch.error_file_id is None
        errors = {(e.line, e.code) for e in batch.errors.data}
        assert errors == {(2, "invalid_json"), (3, "invalid_url"), (4, "duplicate_custom_id"),
                          (6, "unsupported_parameter")}, batch.errors
        assert batch.request_counts.total == 5

        unserved = await c.upload(client, [_line("x", body={"model": "no-such-model", "input": "x"})])
        batch = await c.call(client.batches.create, input_file_id=unserved, endpoint="/v1/embeddings",
                             completion_window="24h")
        assert batch.status == "failed"
        assert [(e.line, e.code) for e in batch.errors.data] == [(1, "model_not_found")]
        # No task was made for either.
        assert await c.conn.fetchval("SELECT count(*) FROM tasks") == 0


async def test_a_batch_past_its_window_expires(database_url: str, tmp_path: Path) -> None:
    async with openai_cluster(database_url, tmp_path) as c:
        await _register_executor(c)
        client = c.client()
        file_id = await c.upload(client, [_line("a"), _line("b", text="world")])
        batch = await c.call(client.batches.create, input_file_id=file_id, endpoint="/v1/embeddings",
                             completion_window="2s", metadata={"project": "nightly"})
        assert batch.status == "in_progress" and batch.expires_at - batch.created_at == 2
        assert await c.conn.fetchval("SELECT project FROM tasks WHERE name = $1", batch.id) == "nightly"
        await asyncio.sleep(2.5)
        batch = await c.batch_until(client, batch.id, "expired")
        assert batch.expired_at is not None and batch.output_file_id is None
        assert batch.request_counts.model_dump() == {"total": 2, "completed": 0, "failed": 2}
        errors = await c.jsonl(client, batch.error_file_id)
        assert [(e["custom_id"], e["error"]["code"], e["response"]) for e in errors] == [
            ("a", "batch_expired", None), ("b", "batch_expired", None)]
        task = await c.native.task("openai", "nightly", batch.id)
        assert task["status"] == "cancelled"


async def test_files_and_batches_list_in_pages(database_url: str, tmp_path: Path) -> None:
    async with openai_cluster(database_url, tmp_path) as c:
        client = c.client()
        file_id = await c.upload(client, [_line("a")])
        made = [(await c.call(client.batches.create, input_file_id=file_id, endpoint="/v1/embeddings",
                              completion_window="24h")).id for _ in range(5)]
        first = await c.call(client.batches.list, limit=2)
        assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
        every = await c.call(lambda: [b.id for b in client.batches.list(limit=2)])  # pages through `after`
        assert every == made[::-1]

        file = await c.call(client.files.retrieve, file_id)
        assert file.purpose == "batch" and file.filename == "input.jsonl" and file.bytes > 0
        assert [f.id for f in await c.call(lambda: list(client.files.list()))] == [file_id]
        content = await c.call(client.files.content, file_id)
        assert content.content.startswith(b'{"custom_id":"a"')
        assert (await c.call(client.files.delete, file_id)).deleted
        with pytest.raises(openai.NotFoundError):
            await c.call(client.files.retrieve, file_id)

        # Another team's token sees none of it.
        other, _ = await make_token(c.conn, "user", "elsewhere")
        assert (await c.call(c.client(other).batches.list)).data == []
        with pytest.raises(openai.NotFoundError):
            await c.call(c.client(other).batches.retrieve, made[0])


async def test_a_users_batch_priority_is_held_to_its_teams_cap(database_url: str, tmp_path: Path) -> None:
    """metadata.priority is the batch task's priority: a user's at most its team's cap (403 naming
    it, nothing created), an admin's any; one that is not an integer from -1000 to 1000 is 422."""
    async with openai_cluster(database_url, tmp_path) as c:
        await _register_executor(c)
        user, _ = await make_token(c.conn, "user", "alpha")
        client = c.client(user)
        file_id = await c.upload(client, [_line("a")])

        def create(metadata: dict[str, str], on: openai.OpenAI = client) -> Any:
            return on.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h",
                                     metadata=metadata)

        with pytest.raises(openai.PermissionDeniedError) as refused:
            await c.call(create, {"priority": "1"})
        assert refused.value.code == "priority_above_cap" and "cap of 0" in refused.value.message
        for bad in ("high", "1001", "1.5", "", " 1"):
            with pytest.raises(openai.UnprocessableEntityError) as invalid:
                await c.call(create, {"priority": bad})
            assert "metadata.priority" in str(invalid.value.body), invalid.value.body
        assert await c.conn.fetchval("SELECT count(*) FROM tasks") == 0

        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c.admin}"}) as http:
            async with http.patch(f"{c.services.api_url}/api/v1/teams/alpha", json={"priority_cap": 3}) as r:
                assert r.status == 200, await r.text()
        at_cap = await c.call(create, {"priority": "3"})
        with pytest.raises(openai.PermissionDeniedError, match="cap of 3"):
            await c.call(create, {"priority": "+4"})
        admin = await c.call(create, {"team": "alpha", "priority": "1000"}, c.client())
        default = await c.call(create, {})
        priorities = {r["name"]: r["priority"] for r in await c.conn.fetch("SELECT name, priority FROM tasks")}
        assert priorities == {at_cap.id: 3, admin.id: 1000, default.id: 0}
        # metadata.placement: "trusted" keeps the batch on vouched executors; anything but any/trusted is 422.
        with pytest.raises(openai.UnprocessableEntityError) as invalid:
            await c.call(create, {"placement": "volunteers"})
        assert "metadata.placement" in str(invalid.value.body), invalid.value.body
        placed = await c.call(create, {"placement": "trusted"})
        assert await c.conn.fetchval("SELECT placement FROM tasks WHERE name = $1", placed.id) == "trusted"
        assert await c.conn.fetchval("SELECT placement FROM tasks WHERE name = $1", default.id) == "any"
