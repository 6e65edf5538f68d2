"""README's "Already using OpenAI's Batch API?" block, run verbatim as a script with the official
`openai` package against real services and a real embedding agent."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

from minions import jsoncodec
from minions.sample import embedding_records
from tests.openai.conftest import MINILM, openai_cluster
from tests.support.paths import REPO


def readme_example() -> str:
    section = (REPO / "README.md").read_text().split("### Already using OpenAI's Batch API?", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's OpenAI section has no python block"
    return match.group(1)


def test_the_readme_example_is_ten_lines() -> None:
    assert len(readme_example().strip().splitlines()) == 10


async def test_the_readme_example_runs_as_written(database_url: str, tmp_path: Path) -> None:
    work = tmp_path / "pipeline"
    work.mkdir()
    requests = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/embeddings",
                 "body": {"model": MINILM, "input": r["text"]}} for i, r in enumerate(embedding_records(20))]
    (work / "requests.jsonl").write_bytes(b"".join(jsoncodec.dumps_line(r) for r in requests))
    async with openai_cluster(database_url, tmp_path) as c:
        c.fleet.start("readme", "--threads", "1", kinds=("embedding",))
        await c.registered("readme")
        env = {**os.environ, "MINIONS_API_URL": c.services.api_url, "MINIONS_TOKEN": c.admin,
               "PYTHONPATH": str(REPO)}
        run = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", readme_example()], cwd=work, env=env,
                                      capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert run.stdout == "completed: 20 of 20 requests answered\n"
