"""README's Python pipeline, run verbatim as a script against real services and a real embedding
agent: the example a new user copies must work as written."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minions.sample import embedding_records
from minions.testing.agents import AgentFleet
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from tests.support.paths import REPO


def readme_pipeline() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### From Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's 'From Python' section has no python block"
    return match.group(1)


def test_the_readme_pipeline_is_ten_lines() -> None:
    assert len(readme_pipeline().strip().splitlines()) == 10


async def test_the_readme_pipeline_runs_as_written(services: Services, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the agent inherits it: no network for the model
    await services.start_all()
    admin, executor_token = await make_tokens(services.database_url)
    fleet = AgentFleet(services, executor_token)
    fleet.start("readme", "--threads", "1", kinds=("embedding",))
    sentences = [r["text"] for r in embedding_records(40)]
    (tmp_path / "sentences.txt").write_text("\n".join(sentences) + "\n")
    env = {**os.environ, "MINIONS_API_URL": services.api_url, "MINIONS_TOKEN": admin, "PYTHONPATH": str(REPO)}
    try:
        run = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", readme_pipeline()], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=240)
    finally:
        fleet.stop_all()
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{fleet.logs()}"
    assert re.fullmatch(r"completed: 40 vectors of 384 dims in \d+\.\d+s\n", run.stdout), run.stdout
    assert "search/ranker/sentences-1" in run.stderr  # the progress bar
