"""The MLX backend on MLX's Linux CPU build (`mlx[cpu]`): parity with transformers, not speed.

- the bundled MiniLM through our MLX BERT forward equals sentence-transformers (cosine >= 0.9999);
- the tiny random Llama through mlx-lm picks transformers' greedy tokens, and a batch generated
  together equals the same records generated one at a time;
- `--backend auto`'s measured choice keeps MLX out when its vectors or tokens fail the gate (a 4-bit
  conversion) or it cannot load the model, and says why;
- bad input: `--backend mlx` without the extra, a model that does not fit under the memory cap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from minions.agents.macos.config import AgentConfigError, build
from minions.agents.macos.runners import mlx_setup
from minions.agents.macos.runners.base import PermanentError, RunnerError
from minions.agents.macos.runners.completion import CompletionParams
from minions.agents.macos.runners.embedding import EmbeddingParams
from minions.agents.macos.runners.mlx_setup import MLXSettings
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner
from tests.agent.factories import subtask
from tests.support.paths import REPO

MISSING = "MLX is not installed here: pip install 'mlx[cpu]' mlx-lm (Linux) or 'minions[mlx]' (Apple silicon)"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TEXTS = [
    "A cat sits on the mat.",
    "",
    "UPPERCASE SHOUTING TEXT!!! and numbers 1234567890",
    "Emoji are tokens too 🚀🔥✨",
    "日本語のテキストも埋め込みます。",
    "def add(a, b):\n    return a + b",
    "Sentence number 3 talks about leases in a formal style.",
    " ".join(f"word{i} is part of a long document about idle Macs" for i in range(60)),  # past 256 tokens
]
RECORDS: list[dict[str, Any]] = [
    {"id": "p1", "prompt": "Why do idle laptops make a good cloud?"},
    {"id": "p2", "prompt": "The machine"},
    {"id": "m1", "messages": [{"role": "user", "content": "What is a lease token?"}]},
    {"id": "m2", "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]},
]
GREEDY = CompletionParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def mlx() -> Any:
    return pytest.importorskip("mlx.core", reason=MISSING)


@pytest.fixture(scope="module")
def embedder(mlx: Any) -> Any:
    from minions.agents.macos.runners.mlx_embedding import MLXEmbeddingRunner

    return MLXEmbeddingRunner(MLXSettings())


@pytest.fixture(scope="module")
def completer(mlx: Any) -> Any:
    if not mlx_setup.available():
        pytest.skip(MISSING)
    from minions.agents.macos.runners.mlx_completion import MLXCompletionRunner

    return MLXCompletionRunner(MLXSettings())


@pytest.fixture(scope="module")
def torch_completer() -> TransformersCompletionRunner:
    return TransformersCompletionRunner(TorchSettings(device="cpu", threads=2, precision="fp32"))


async def test_minilm_on_mlx_equals_sentence_transformers(embedder: Any, minilm_path: str) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(minilm_path, device="cpu").encode(TEXTS, normalize_embeddings=True)
    records = [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)]
    out = await embedder.run(subtask("embedding", MODEL, {"batch_size": 3}, len(records)), records)

    assert [o["id"] for o in out] == [r["id"] for r in records]
    got = np.asarray([o["embedding"] for o in out], dtype=np.float64)
    assert got.shape == (len(TEXTS), 384)
    cosine = (got * reference).sum(axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999, cosine
    assert out[-1]["usage"]["prompt_tokens"] == 256  # truncated at max_length, as transformers does
    [report] = embedder.precision_reports()
    assert report == {"model": MODEL, "device": "mlx-cpu", "precision": "fp32", "cosine": 1.0, "setting": "auto",
                      "backend": "mlx"}


async def test_cls_pooling_and_no_normalisation_follow_the_params(embedder: Any, minilm_path: str) -> None:
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(minilm_path), AutoModel.from_pretrained(minilm_path)
    import torch

    with torch.inference_mode():
        cls = model(**tokenizer(TEXTS[:3], padding=True, return_tensors="pt"))[0][:, 0].numpy()
    got = embedder.encode(MODEL, TEXTS[:3], EmbeddingParams(pooling="cls", normalize=False))
    assert np.allclose(got, cls, atol=1e-4)
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0)


async def test_quantized_folder_loads_and_reports_its_quantisation(embedder: Any, minilm_path: str,
                                                                   tmp_path: Path) -> None:
    from tests.agent.mlx_models import quantized_copy

    folder = str(quantized_copy(Path(minilm_path), tmp_path / "minilm-8bit", bits=8))
    vectors = embedder.encode(folder, TEXTS[:2], EmbeddingParams())
    assert vectors.shape == (2, 384) and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    report = embedder.report(folder)
    # No fp32 weights to compare with in the folder: its cosine is known only against a reference.
    assert report["quantization"] == "8-bit g64" and report["cosine"] is None and report["backend"] == "mlx"


async def test_tiny_llama_greedy_tokens_equal_transformers(completer: Any, torch_completer: Any,
                                                           tiny_lm_dirs: dict[str, Path]) -> None:
    for folder in tiny_lm_dirs.values():  # a plain prompt, and through a chat template
        model = str(folder)
        ours = completer.generate(model, RECORDS, GREEDY)
        theirs = torch_completer.generate(model, RECORDS, GREEDY)
        assert [(o["text"], o["usage"]) for o in ours] == [(t["text"], t["usage"]) for t in theirs]
        loaded = completer.load(model)
        prompts = [completer.prompt_ids(model, r, GREEDY) for r in RECORDS]
        ids = completer.generate_ids(loaded, prompts, GREEDY)
        assert all(len(row) == 12 for row in ids)  # random weights: no end of sequence within 12
        assert [loaded.tokenizer.decode(row, skip_special_tokens=True) for row in ids] == [t["text"] for t in theirs]


async def test_batched_generation_equals_one_at_a_time(completer: Any, tiny_lm_dirs: dict[str, Path]) -> None:
    model = str(tiny_lm_dirs["plain"])
    together = completer.generate(model, RECORDS, GREEDY)
    alone = [completer.generate(model, [record], GREEDY)[0] for record in RECORDS]
    assert together == alone
    assert len({o["text"] for o in together}) == len(RECORDS)  # not one answer for all


async def test_completion_runner_serves_a_subtask(completer: Any, tiny_lm_dirs: dict[str, Path]) -> None:
    model = str(tiny_lm_dirs["chat"])
    out = await completer.run(subtask("completion", model, {"temperature": 0, "max_tokens": 5}, 4), RECORDS)
    assert [o["id"] for o in out] == ["p1", "p2", "m1", "m2"]
    assert all(o["usage"]["completion_tokens"] == 5 for o in out)
    with pytest.raises(PermanentError, match="messages must be a non-empty list"):
        await completer.run(subtask("completion", model), [{"id": 1, "messages": []}])
    [report] = await completer.fingerprints([model])
    assert report["backend"] == "mlx" and report["precision"] == "fp32"


def test_a_quantized_conversion_failing_the_gate_is_not_used_under_auto(embedder: Any, minilm_path: str,
                                                                        tmp_path: Path) -> None:
    from minions.agents.macos.runners.backend_choice import EmbeddingBackends, gate_refusal, transformers_reference
    from tests.agent.mlx_models import quantized_copy

    folder = str(quantized_copy(Path(minilm_path), tmp_path / "minilm-4bit", bits=4))
    # Its 4-bit vectors against fp32 transformers on the same model: what auto gates MLX with.
    report = embedder.load(folder, reference=transformers_reference(minilm_path)).report
    assert report["quantization"] == "4-bit g64" and 0.5 < report["cosine"] < 0.9999
    why = f"mlx (4-bit g64): cosine {report['cosine']} to fp32 transformers, below 0.9999"
    assert gate_refusal(report, 0.9999) == why
    assert gate_refusal({**report, "cosine": 0.99995}, 0.9999) is None

    # The conversion on its own under auto: transformers cannot read it, and without a reference MLX's
    # vectors cannot be shown within the gate, so neither serves it, and registration says why.
    backends = EmbeddingBackends(TorchSettings(device="cpu", threads=2, precision="fp32"), MLXSettings())
    try:
        with pytest.raises(RunnerError, match="transformers cannot load it and MLX's vectors cannot be shown within"):
            backends.choose(folder)
    finally:
        backends._thread.shutdown()
    [refused] = backends.precision_reports()
    assert refused["backend"] is None and refused["rejected"].startswith("mlx (4-bit g64): no fp32 transformers")


def test_auto_serves_with_torch_what_mlx_cannot_load(mlx: Any, tiny_lm_dirs: dict[str, Path]) -> None:
    from minions.agents.macos.runners.backend_choice import EmbeddingBackends

    backends = EmbeddingBackends(TorchSettings(device="cpu", threads=2, precision="fp32"), MLXSettings())
    model = str(tiny_lm_dirs["plain"])  # a Llama: the MLX encoder runs BERT only
    try:
        assert backends.choose(model) == "torch"
        vectors = backends._torch.encode(model, ["still served"], EmbeddingParams())
    finally:
        backends._thread.shutdown()
    assert len(vectors[0]) == 64
    [report] = backends.precision_reports()
    assert report["backend"] == "torch" and "model_type 'llama'" in report["rejected"]


async def test_backend_mlx_fails_a_model_mlx_cannot_load(embedder: Any, tiny_lm_dirs: dict[str, Path]) -> None:
    with pytest.raises(RunnerError, match=r"MLX cannot load embedding model .*model_type 'llama'") as caught:
        await embedder.run(subtask("embedding", str(tiny_lm_dirs["plain"])), [{"id": 1, "text": "x"}])
    assert caught.value.retryable  # a torch executor may serve it


def test_auto_measures_completions_and_keeps_matching_tokens(mlx: Any, tiny_lm_dirs: dict[str, Path]) -> None:
    from minions.agents.macos.runners.backend_choice import CompletionBackends

    model = str(tiny_lm_dirs["plain"])
    backends = CompletionBackends(TorchSettings(device="cpu", threads=2, precision="fp32"), MLXSettings())
    try:
        chosen = backends.choose(model)
    finally:
        backends._thread.shutdown()
    [report] = backends.precision_reports()
    assert report["backend"] == chosen and chosen in ("torch", "mlx")
    assert report["why"].startswith("faster: torch ") and "rejected" not in report


def test_a_model_larger_than_the_memory_cap_is_refused_at_load(mlx: Any, minilm_path: str) -> None:
    from minions.agents.macos.runners.mlx_embedding import MLXEmbeddingRunner

    runner = MLXEmbeddingRunner(MLXSettings(memory_fraction=1e-6))
    try:
        with pytest.raises(RunnerError, match=r"does not fit: its weights take 0.08 GiB, more than the 0.00 GiB"):
            runner.load(MODEL)
    finally:
        mlx_setup.prepare(MLXSettings())  # the process-wide cap back to the default for later tests


def test_backend_mlx_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mlx_setup, "available", lambda: False)
    with pytest.raises(AgentConfigError, match=r"backend mlx needs the \[mlx\] extra .*pip install 'minions\[mlx\]'"):
        build({"token": "t", "backend": "mlx"})
    with pytest.raises(AgentConfigError, match="backend must be one of auto, torch, mlx, ollama"):
        build({"token": "t", "backend": "metal"})
    assert build({"token": "t", "backend": "auto"}).backend == "auto"  # auto without MLX: torch


def test_backends_pick_the_runners(monkeypatch: pytest.MonkeyPatch) -> None:
    from minions.agents.macos.runners import backend_choice, registry

    def names(**values: Any) -> dict[str, str]:
        config = build({"token": "t", "kinds": ["embedding", "completion"], **values})
        return {kind: type(r).__name__ for kind, r in registry.build_runners(config, "cpu").items()}

    monkeypatch.setattr(backend_choice, "apple_silicon", lambda: False)
    assert names() == {"embedding": "EmbeddingRunner", "completion": "OllamaCompletionRunner"}
    assert names(backend="torch") == {"embedding": "EmbeddingRunner", "completion": "TransformersCompletionRunner"}
    assert names(backend="ollama") == {"embedding": "EmbeddingRunner", "completion": "OllamaCompletionRunner"}
    monkeypatch.setattr(backend_choice, "apple_silicon", lambda: True)
    monkeypatch.setattr(mlx_setup, "available", lambda: True)
    assert names(completion_backend="transformers") == {"embedding": "EmbeddingBackends",
                                                        "completion": "CompletionBackends"}
    assert names() == {"embedding": "EmbeddingBackends", "completion": "OllamaCompletionRunner"}
    assert names(backend="mlx") == {"embedding": "MLXEmbeddingRunner", "completion": "MLXCompletionRunner"}



def test_backend_is_a_flag_and_a_file_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from minions.agents.macos.config import add_arguments, from_args, load_toml, to_toml

    monkeypatch.setattr(mlx_setup, "available", lambda: True)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    file = tmp_path / "agent.toml"
    file.write_text('token = "t"\nbackend = "torch"\n')
    assert from_args(parser.parse_args(["--config", str(file)]), {}).backend == "torch"
    flagged = from_args(parser.parse_args(["--config", str(file), "--backend", "mlx"]), {})
    assert flagged.backend == "mlx"
    file.write_text(to_toml(flagged))
    assert load_toml(file)["backend"] == "mlx"


async def test_auto_chooses_at_start_for_the_configured_completion_models_found_here(
        tiny_lm_dirs: dict[str, Path]) -> None:
    from minions.agents.macos.runners.backend_choice import CompletionBackends

    here = str(tiny_lm_dirs["plain"])
    backends = CompletionBackends(TorchSettings(device="cpu"), MLXSettings(), [here, "nobody/absent-model"])
    try:
        assert await backends.advertised_models() == [here]  # prepared (and chosen) before registering
    finally:
        await backends.aclose()


def test_a_model_that_is_nowhere_is_retryable_and_a_bad_name_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RunnerError, match="cannot fetch embedding model 'someone/not-cached-model'") as caught:
        mlx_setup.model_folder("someone/not-cached-model", "embedding")
    assert caught.value.retryable  # an executor that holds it may serve it
    with pytest.raises(PermanentError, match="unknown completion model 'not a valid id!!'"):
        mlx_setup.model_folder("not a valid id!!", "completion")


def test_importing_mlx_lm_keeps_the_open_file_limit(mlx: Any) -> None:
    """mlx_lm.utils sets RLIMIT_NOFILE to (2048, 4096) at import; through import_mlx_lm the process
    keeps what it had (fresh processes: this one may have imported mlx_lm already)."""
    if not mlx_setup.available():
        pytest.skip(MISSING)
    limits = ("import json, resource; limit = lambda: list(resource.getrlimit(resource.RLIMIT_NOFILE)); "
              "before = limit(); ")
    helper = limits + "from minions.agents.macos.runners import mlx_setup; mlx_setup.import_mlx_lm(); "
    helper += "import mlx_lm.utils; "
    bare = limits + "import mlx_lm; "
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def before_after(code: str) -> list[list[int]]:
        run = subprocess.run([sys.executable, "-c", code + "print(json.dumps([before, limit()]))"], env=env,
                             capture_output=True, text=True, check=True, timeout=120)
        return json.loads(run.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    before, after = before_after(helper)
    assert after == before
    before, after = before_after(bare)  # what the plain import does, the reason for the helper
    assert after == before or after == [2048, 4096], (before, after)
