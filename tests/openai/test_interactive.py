"""The interactive lane: client.embeddings.create answered synchronously by a real agent, with the
native API's vectors; 404 model_not_found at once for a model no executor ever advertised (503 with
Retry-After for a known one none online serves: tests/openai/test_known_models.py)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import openai
import pytest

from minions import jsoncodec
from minions.testing.waiting import eventually
from tests.openai.conftest import MINILM, openai_cluster


async def test_embeddings_create_is_answered_by_an_agent(database_url: str, tmp_path: Path) -> None:
    texts = ["an idle laptop embeds text", "while its owner sleeps", "a third, longer sentence for padding"]
    async with openai_cluster(database_url, tmp_path) as c:
        client = c.client()
        # No executor ever advertised it: refused at once, never left hanging.
        started = time.monotonic()
        with pytest.raises(openai.NotFoundError) as refused:
            await c.call(client.embeddings.create, model=MINILM, input=texts)
        assert refused.value.code == "model_not_found"
        assert time.monotonic() - started < 30  # not a wait for an executor (generous for a busy machine)

        c.fleet.start("emb", "--threads", "1", kinds=("embedding",))
        await c.registered("emb")
        # The client asks for base64 unless told otherwise: both encodings, decoded by the client.
        packed = await c.call(client.embeddings.create, model=MINILM, input=texts)
        floats = await c.call(client.embeddings.create, model=MINILM, input=texts, encoding_format="float")
        single = await c.call(client.embeddings.create, model=MINILM, input=texts[0])
        await c.native.submit({"team": "search", "project": "p", "name": "n", "kind": "embedding",
                                        "model": MINILM, "input": {"records": [{"id": i, "text": t}
                                                                               for i, t in enumerate(texts)]}})

        async def ended() -> bool:
            return (await c.native.task("search", "p", "n"))["status"] == "completed"

        await eventually(ended, "the native task", 120)
        body = b"".join([chunk async for chunk in c.native.results("search", "p", "n")])
        reference = [jsoncodec.loads(line)["embedding"] for line in body.splitlines()]

    for response in (packed, floats):
        assert response.object == "list" and response.model == MINILM
        assert [d.index for d in response.data] == [0, 1, 2]
        # Values are float32: as float32 they are the very same numbers (the JSON text is float32's
        # shortest, base64 the float32 bits).
        got = np.asarray([d.embedding for d in response.data], dtype=np.float32)
        assert np.array_equal(got, np.asarray(reference, dtype=np.float32))
        assert response.usage.prompt_tokens == response.usage.total_tokens > len(texts) * 2
    assert list(single.data[0].embedding) == pytest.approx(reference[0], abs=1e-6)
