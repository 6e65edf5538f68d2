"""Which model the agent serves under each name: the Hugging Face commit of the
snapshot it loads, else a SHA-256 over the model folder's files, Ollama's digest; reported at
registration with the precision and backend, and never served as another model than reported."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import huggingface_hub.constants
import pytest
import pytest_asyncio

from minions.agents.macos.runners import model_paths
from minions.agents.macos.runners.base import ReportsFingerprints, RunnerError
from minions.agents.macos.runners.embedding import EmbeddingRunner
from minions.agents.macos.runners.model_identity import ModelIdentities
from minions.agents.macos.runners.ollama_completion import OllamaCompletionRunner
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner
from tests.agent.ollama_double import OllamaDouble

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root: Path, repo_id: str, source: Path, commit: str = COMMIT) -> Path:
    repo = root / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(source, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_a_folder_is_its_files_and_a_snapshot_its_commit(tmp_path: Path, tiny_lm_dirs: dict[str, Path]) -> None:
    folder = tmp_path / "lm"
    shutil.copytree(tiny_lm_dirs["plain"], folder)
    first = model_paths.fingerprint(str(folder))
    assert first is not None and first.startswith("sha256:") and len(first) == 7 + 64
    (folder / "README.md").write_text("not the model")  # not a model file: same model
    assert model_paths.fingerprint(str(folder)) == first
    config = folder / "config.json"
    config.write_text(config.read_text().replace("}", ', "minions_note": 1}', 1))
    changed = model_paths.fingerprint(str(folder))
    assert changed != first and changed is not None and changed.startswith("sha256:")

    snapshot = _hub_cache(tmp_path / "hub", "org/lm", tiny_lm_dirs["plain"])
    assert model_paths.fingerprint(str(snapshot)) == COMMIT


def test_a_hub_id_is_the_commit_its_cache_names(tmp_path: Path, tiny_lm_dirs: dict[str, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _hub_cache(tmp_path / "hub", "org/lm", tiny_lm_dirs["plain"])
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_paths.fingerprint("org/lm") == COMMIT
    assert model_paths.fingerprint("org/absent") is None
    assert model_paths.fingerprint("not a valid id!") is None


async def test_runners_report_what_they_load(tiny_lm_dirs: dict[str, Path], minilm_path: str) -> None:
    completion = TransformersCompletionRunner(TorchSettings(device="cpu", precision="fp32"))
    embedding = EmbeddingRunner(TorchSettings(device="cpu", precision="fp32"))
    try:
        assert isinstance(completion, ReportsFingerprints) and isinstance(embedding, ReportsFingerprints)
        plain = str(tiny_lm_dirs["plain"])
        reports = await completion.fingerprints([plain, "org/absent"])
        assert reports == [{"model": plain, "fingerprint": model_paths.fingerprint(plain), "precision": "fp32",
                            "backend": "transformers", "proofs": 1}]  # proofs of generation, version 1
        assert (await embedding.fingerprints([minilm_path]))[0]["precision"] == "fp32"  # forced: known before load
        auto = EmbeddingRunner(TorchSettings(device="cpu"))
        assert (await auto.fingerprints([minilm_path]))[0]["precision"] is None  # auto: chosen at load
        await auto.aclose()
        await embedding.prepare(minilm_path)
        loaded = await embedding.fingerprints([minilm_path])
        assert loaded == [{"model": minilm_path, "fingerprint": model_paths.fingerprint(minilm_path),
                           "precision": "fp32", "backend": "transformers"}]
    finally:
        await completion.aclose()
        await embedding.aclose()


def test_a_model_changed_since_registration_is_not_served(tmp_path: Path, tiny_lm_dirs: dict[str, Path]) -> None:
    folder = tmp_path / "lm"
    shutil.copytree(tiny_lm_dirs["plain"], folder)
    identities = ModelIdentities("transformers")
    reported = identities.reports([str(folder)], lambda model: None)
    config = folder / "config.json"
    config.write_text(config.read_text().replace("}", ', "minions_note": 2}', 1))
    with pytest.raises(RunnerError, match="restart the agent"):
        identities.loaded(str(folder), object())
    assert identities.fingerprint(str(folder)) is None
    assert reported[0]["fingerprint"] != model_paths.fingerprint(str(folder))


def test_a_reload_that_resolves_to_other_files_is_not_served(tmp_path: Path, tiny_lm_dirs: dict[str, Path]) -> None:
    """A model first loaded after registration (not reported then), unloaded for another and loaded
    again from files that changed meanwhile, is refused too, not served as the first identity."""
    folder = tmp_path / "lm"
    shutil.copytree(tiny_lm_dirs["plain"], folder)
    identities = ModelIdentities("transformers")
    identities.loaded(str(folder), object())
    first = identities.fingerprint(str(folder))
    assert first is not None
    config = folder / "config.json"
    config.write_text(config.read_text().replace("}", ', "minions_note": 3}', 1))
    with pytest.raises(RunnerError, match="restart the agent"):
        identities.loaded(str(folder), object())
    assert identities.fingerprint(str(folder)) == first


@pytest_asyncio.fixture
async def double(tiny_lm_dirs: dict[str, Path]) -> AsyncIterator[OllamaDouble]:
    server = OllamaDouble(tiny_lm_dirs["plain"], models=["tiny:latest", "llama3.2:1b"])
    await server.start()
    yield server
    await server.stop()


async def test_ollama_reports_each_models_digest(double: OllamaDouble) -> None:
    runner = OllamaCompletionRunner(double.url)
    assert await runner.fingerprints(["tiny"]) == []  # nothing listed yet
    models = await runner.advertised_models()
    reports = {r["model"]: r for r in await runner.fingerprints([*models, "absent"])}
    assert set(reports) == {"tiny:latest", "llama3.2:1b", "tiny"}
    assert reports["tiny"]["fingerprint"] == reports["tiny:latest"]["fingerprint"]
    assert reports["tiny"]["fingerprint"].startswith("sha256:") and reports["tiny"]["precision"] == "Q8_0"
    assert reports["tiny"]["fingerprint"] != reports["llama3.2:1b"]["fingerprint"]
    assert reports["tiny"]["backend"] == "ollama"
    await runner.aclose()
