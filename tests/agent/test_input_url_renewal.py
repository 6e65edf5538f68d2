"""The agent reads its input through the lease's range-scoped URL and takes the fresh one each
heartbeat sends: an input URL lasts the lease timeout plus MINIONS_INPUT_URL_MARGIN_S,
so a download that starts (or retries) after the claim's URL expired must use the renewed URL.

The real API in this process (tests/agent/test_agent_loop.py's world), a local store, and the agent's
own Agent and ExecutorClient; the only change to the client is a pause before its store requests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from minions.agents.macos.client import ExecutorClient
from minions.testing.waiting import eventually
from tests.agent.test_agent_loop import running_agent, world

# The claim's input URL expires 1.5 s after the claim (lease timeout 1.5 s, no margin); heartbeats every
# 0.2 s keep the lease live and renew the URL.
LEASE_TIMEOUT_S = 1.5
PAUSE_S = 2.5
SEEN: list[tuple[str, str]] = []  # (the URL a GET was given, the URL it used after the pause)


class _LateDownloads(ExecutorClient):
    """Pauses before each input GET (a slow start, a retry's backoff) past the claim URL's expiry, and
    records the URL it was first given and the one it finally used."""

    async def _store_request(self, method: str, url: str | Callable[[], str], *, attempt: int,
                             headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, bytes]:
        if method == "GET":
            given = url() if callable(url) else url
            await asyncio.sleep(PAUSE_S)
            used = url() if callable(url) else url
            SEEN.append((given, used))
        return await super()._store_request(method, url, attempt=attempt, headers=headers, data=data)


async def test_a_download_after_the_claims_url_expired_uses_the_renewed_url(
        database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    SEEN.clear()
    async with world(database_url, tmp_path, caplog, lease_timeout_s=LEASE_TIMEOUT_S, input_url_margin_s=0.0,
                     inline_input_bytes=0, input_in_database_bytes=0) as w, \
            running_agent(w, client_type=_LateDownloads):
        records = [{"id": f"r{i}", "ms": 1} for i in range(4)]
        task_id = await w.submit("late", "sleep", records, subtask_size=4)
        reply = await w.api.call("GET", "/api/v1/tasks/search/ranker/late")
        assert reply.body["input_uri"], "the input must be an object, read through its URL"
        await eventually(lambda: w.status_is("late", "completed", "failed"), "the task to end")
        assert await w.results("late") == [{"id": f"r{i}", "slept_ms": 1} for i in range(4)]
        assert [a["outcome"] for a in await w.attempts(task_id)] == ["done"]  # no failed download first
    [(given, used)] = SEEN
    assert used != given  # the heartbeats' URL, not the claim's (which had expired)
    assert "&start=0&end=" in used  # scoped to the lease's range
