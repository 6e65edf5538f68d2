"""The /v1 adapter's tests drive it with the official `openai` package, as a pipeline would, against
real services (and, where a test needs results, real agent processes)."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from openai import OpenAI

from minions import jsoncodec
from minions.db.connect import connect
from minions.sdk import MinionsClient
from minions.testing.agents import AgentFleet
from minions.testing.factories import make_token
from minions.testing.processes import Services
from minions.testing.waiting import eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
WAIT_S = 120.0
T = TypeVar("T")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")


@dataclass
class OpenAICluster:
    services: Services
    fleet: AgentFleet
    native: MinionsClient  # the native API, to compare with
    conn: asyncpg.Connection
    admin: str
    executor_token: str

    def client(self, token: str | None = None) -> OpenAI:
        return OpenAI(base_url=f"{self.services.api_url}/v1", api_key=token or self.admin, max_retries=0)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """The openai client is synchronous: run it off the event loop."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def upload(self, client: OpenAI, lines: list[Any]) -> str:
        body = b"".join(line if isinstance(line, bytes) else jsoncodec.dumps_line(line) for line in lines)
        uploaded = await self.call(client.files.create, file=("input.jsonl", io.BytesIO(body)), purpose="batch")
        return uploaded.id

    async def batch_until(self, client: OpenAI, batch_id: str, *statuses: str, timeout_s: float = WAIT_S) -> Any:
        async def reached() -> Any:
            batch = await self.call(client.batches.retrieve, batch_id)
            return batch if batch.status in statuses else None

        return await eventually(reached, f"batch {batch_id} to reach {statuses}", timeout_s, interval_s=0.2)

    async def jsonl(self, client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        content = await self.call(client.files.content, file_id)
        return [jsoncodec.loads(line) for line in content.content.splitlines() if line.strip()]

    async def registered(self, *names: str, timeout_s: float = WAIT_S) -> None:
        async def ids() -> bool:
            for agent in self.fleet.agents:
                assert agent.process.poll() is None, f"agent {agent.name} exited:\n{agent.log()[-3000:]}"
            found = {e["name"] for e in await self.native.executors() if e["status"] != "offline"}
            return set(names) <= found

        await eventually(ids, f"agents {names} to register", timeout_s)


@contextlib.asynccontextmanager
async def openai_cluster(database_url: str, tmp_path: Path) -> AsyncIterator[OpenAICluster]:
    services = Services(database_url, tmp_path / "services", heartbeat_interval_s=0.5, lease_timeout_s=5.0)
    conn = await connect(database_url)
    admin, _ = await make_token(conn, "admin")
    executor, _ = await make_token(conn, "executor")
    fleet = AgentFleet(services, executor)
    native = MinionsClient(services.api_url, admin)
    try:
        await services.start_all()
        yield OpenAICluster(services, fleet, native, conn, admin, executor)
    except BaseException:
        print(services.logs(), fleet.logs(), sep="\n")
        raise
    finally:
        await asyncio.to_thread(fleet.stop_all)
        await native.close()
        await conn.close()
        await asyncio.to_thread(services.stop_all)
