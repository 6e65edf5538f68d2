"""A batch of a model the pool knows, created while no executor is online (every Mac asleep, the
local agent still loading), waits within its window and completes once an executor comes; the
interactive lane's requests, a task each, stay out of the task list (API, `minions status`) unless
asked for."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import aiohttp

from minions import jsoncodec
from minions.sample import embedding_records
from tests.openai.conftest import MINILM, OpenAICluster, openai_cluster
from tests.support.paths import REPO


async def _a_mac_that_served_it_and_went_to_sleep(c: OpenAICluster) -> None:
    """An executor advertises MiniLM (the model is known from then on) and leaves, as a Mac does when
    its lid closes."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c.executor_token}"}) as http:
        async with http.post(f"{c.services.api_url}/api/v1/executors/register",
                             json={"name": "asleep", "hardware": {}, "kinds": ["embedding"], "models": [MINILM]}) as r:
            assert r.status == 201, await r.text()
            executor_id = (await r.json())["executor_id"]
        async with http.post(f"{c.services.api_url}/api/v1/executors/{executor_id}/deregister", json={}) as r:
            assert r.status == 200, await r.text()


async def _status(c: OpenAICluster, *flags: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MINIONS_API_URL": c.services.api_url, "MINIONS_TOKEN": c.admin}
    run = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "minions.cli.main", "status", *flags],
                                  env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout


async def test_a_batch_created_with_no_executor_online_completes_once_one_comes(database_url: str,
                                                                                tmp_path: Path) -> None:
    texts = [r["text"] for r in embedding_records(6)]
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": MINILM, "input": t}}
             for i, t in enumerate(texts)]
    async with openai_cluster(database_url, tmp_path) as c:
        await _a_mac_that_served_it_and_went_to_sleep(c)
        client = c.client()
        batch = await c.call(client.batches.create, input_file_id=await c.upload(client, lines),
                             endpoint="/v1/embeddings", completion_window="1h", metadata={"project": "nightly"})
        assert batch.status == "in_progress" and batch.errors is None
        await asyncio.sleep(1.0)  # nobody to run it: it waits, neither failed nor expired
        assert (await c.call(client.batches.retrieve, batch.id)).status == "in_progress"

        c.fleet.start("morning", "--threads", "1", kinds=("embedding",))
        batch = await c.batch_until(client, batch.id, "completed", "failed", "expired")
        assert batch.status == "completed"
        assert batch.request_counts.model_dump() == {"total": 6, "completed": 6, "failed": 0}
        output = await c.jsonl(client, batch.output_file_id)
        assert [o["custom_id"] for o in output] == [f"r{i}" for i in range(6)]
        assert all(len(o["response"]["body"]["data"][0]["embedding"]) == 384 for o in output)

        # An interactive request is a task too, hidden from the task list unless asked for.
        answer = await c.call(client.embeddings.create, model=MINILM, input=texts[0], encoding_format="float")
        assert len(answer.data[0].embedding) == 384
        batch_task = f"openai/nightly/{batch.id}"

        def names(page: dict[str, object]) -> list[str]:
            tasks = page["tasks"]
            assert isinstance(tasks, list)
            return [f"{t['team']}/{t['project']}/{t['name']}" for t in tasks]

        hidden = names(await c.native.tasks())
        assert hidden == [batch_task]
        both = names(await c.native.tasks(interactive="all"))
        only = names(await c.native.tasks(interactive="true"))
        assert len(both) == 2 and both[1] == batch_task and both[0].startswith("openai/interactive/req_")
        assert only == both[:1]
        assert names(await c.native.tasks(interactive="false")) == hidden
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {c.admin}"}) as http, \
                http.get(f"{c.services.api_url}/api/v1/tasks", params={"interactive": "yes"}) as r:
            assert r.status == 422
            assert "interactive" in jsoncodec.loads(await r.read())["error"]["fields"]

        table = await _status(c)
        assert batch.id in table and "req_" not in table
        table = await _status(c, "--all")
        assert batch.id in table and both[0].rsplit("/", 1)[1] in table

