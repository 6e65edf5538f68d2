"""The `cli` fixture: the `minions` command run as a subprocess against real services."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest_asyncio

from minions import jsoncodec
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from tests.support.paths import REPO


@dataclass
class Cli:
    services: Services
    admin: str
    executor: str
    cwd: Path

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), "MINIONS_API_URL": self.services.api_url,
               "MINIONS_TOKEN": self.admin, "XDG_STATE_HOME": str(self.cwd / "state")}
        env.pop("XDG_RUNTIME_DIR", None)
        return env

    async def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "minions.cli.main", *args], cwd=self.cwd, env=self.env(),
            capture_output=True, text=True, timeout=120, check=False)

    async def shell(self, line: str) -> subprocess.CompletedProcess[str]:
        env = {**self.env(), "MINIONS": f"{sys.executable} -m minions.cli.main"}
        return await asyncio.to_thread(subprocess.run, ["bash", "-c", line], cwd=self.cwd, env=env,
                                       capture_output=True, text=True, timeout=120, check=False)

    async def get(self, path: str) -> tuple[int, object]:
        async with aiohttp.ClientSession() as session, session.get(
                self.services.api_url + path, headers={"Authorization": f"Bearer {self.admin}"}) as resp:
            return resp.status, jsoncodec.loads(await resp.read())

    def inputs(self) -> list[Path]:
        return sorted((self.services.store_root / "inputs").rglob("*.jsonl"))


@pytest_asyncio.fixture
async def cli(services: Services, database_url: str, tmp_path: Path) -> AsyncIterator[Cli]:
    await services.start_all()
    admin, executor = await make_tokens(database_url)
    (tmp_path / "cwd").mkdir()
    yield Cli(services, admin, executor, tmp_path / "cwd")
