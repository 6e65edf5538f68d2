"""README's "Already using OpenAI's Batch API?" blocks, run verbatim: the shell line that takes the
variables from `minions env`, then the script, with the official `openai` package against real
services and a real embedding agent."""

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


def _block(language: str) -> str:
    section = (REPO / "README.md").read_text().split("### Already using OpenAI's Batch API?", 1)[1]
    section = section.split("\n### ", 1)[0]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"README's OpenAI section has no {language} block"
    return match.group(1)


def readme_example() -> str:
    return _block("python")


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
        # The `minions up` of this machine, as its up.json says (in the state dir, found from any folder).
        state = tmp_path / "state"
        (state / "minions").mkdir(parents=True)
        (state / "minions" / "up.json").write_bytes(jsoncodec.dumps(
            {"api_url": c.services.api_url, "admin_token": c.admin, "data_dir": str(tmp_path)}))
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "minions").write_text(f"#!/bin/sh\nexec {sys.executable} -m minions.cli.main \"$@\"\n")
        (bin_dir / "minions").chmod(0o755)
        (work / "pipeline.py").write_text(readme_example())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MINIONS_", "OPENAI_"))}
        env |= {"PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(state), "PATH": f"{bin_dir}:{env['PATH']}"}
        script = f"{_block('sh')}\n{sys.executable} pipeline.py\n"
        run = await asyncio.to_thread(subprocess.run, ["bash", "-ec", script], cwd=work, env=env,
                                      capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert run.stdout == "completed: 20 of 20 requests answered\n"
