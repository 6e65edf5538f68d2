"""Builds the runners for the kinds an agent serves, importing only what those kinds need."""

from __future__ import annotations

from minions.agents.macos.config import AgentConfig
from minions.agents.macos.runners.base import Runner
from minions.agents.macos.runners.torch_setup import TorchSettings


def uses_torch(config: AgentConfig) -> bool:
    return "embedding" in config.kinds or ("completion" in config.kinds and config.completion_backend == "transformers")


def build_runners(config: AgentConfig, device: str) -> dict[str, Runner]:
    torch_settings = TorchSettings(
        device=device,
        threads=config.threads,
        mps_memory_fraction=config.mps_memory_fraction,
        precision=config.precision,
        min_cosine=config.min_cosine,
        generation_batch_size=config.generation_batch_size,
    )
    runners: dict[str, Runner] = {}
    if "sleep" in config.kinds:
        from minions.agents.macos.runners.sleep import SleepRunner

        runners["sleep"] = SleepRunner()
    if "embedding" in config.kinds:
        from minions.agents.macos.runners.embedding import EmbeddingRunner

        runners["embedding"] = EmbeddingRunner(torch_settings)
    if "completion" in config.kinds:
        if config.completion_backend == "transformers":
            from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner

            runners["completion"] = TransformersCompletionRunner(torch_settings)
        else:
            from minions.agents.macos.runners.ollama_completion import OllamaCompletionRunner

            runners["completion"] = OllamaCompletionRunner(
                config.ollama_host, config.allow_pull, parallel=config.ollama_parallel
            )
    return runners
