"""Builds the runners for the kinds an agent serves, importing only what those kinds need.

The engine per kind follows `backend` (config.py): torch (transformers, or Ollama for completions
when completion_backend says so), mlx, ollama (completions through Ollama), or auto, which measures
torch against MLX per model on Apple silicon with the [mlx] extra (backend_choice.py) and is torch
elsewhere.
"""

from __future__ import annotations

from minions.agents.macos.config import AgentConfig
from minions.agents.macos.runners.base import Runner
from minions.agents.macos.runners.mlx_setup import MLXSettings
from minions.agents.macos.runners.torch_setup import TorchSettings


def embedding_engine(config: AgentConfig) -> str:
    """torch, mlx, or auto (measured per model: backend_choice.py)."""
    from minions.agents.macos.runners.backend_choice import compares_engines

    if config.backend == "mlx":
        return "mlx"
    return "auto" if compares_engines(config.backend) else "torch"


def completion_engine(config: AgentConfig) -> str:
    """transformers, mlx, ollama, or auto (transformers against mlx-lm, measured per model). Under
    auto the completion_backend setting stands: Ollama, or transformers measured against MLX."""
    from minions.agents.macos.runners.backend_choice import compares_engines

    if config.backend == "mlx":
        return "mlx"
    if config.backend == "ollama":
        return "ollama"
    if config.backend == "torch":
        return "transformers"
    if config.completion_backend == "transformers" and compares_engines(config.backend):
        return "auto"
    return config.completion_backend


def uses_torch(config: AgentConfig) -> bool:
    return ("embedding" in config.kinds and embedding_engine(config) != "mlx") or (
        "completion" in config.kinds and completion_engine(config) in ("transformers", "auto"))


def build_runners(config: AgentConfig, device: str) -> dict[str, Runner]:
    torch_settings = TorchSettings(
        device=device,
        threads=config.threads,
        mps_memory_fraction=config.mps_memory_fraction,
        precision=config.precision,
        min_cosine=config.min_cosine,
        generation_batch_size=config.generation_batch_size,
    )
    # One memory share for both engines: the owner's unified memory is the same either way.
    mlx_settings = MLXSettings(
        memory_fraction=config.mps_memory_fraction,
        precision=config.precision,
        min_cosine=config.min_cosine,
        generation_batch_size=config.generation_batch_size,
    )
    runners: dict[str, Runner] = {}
    if "sleep" in config.kinds:
        from minions.agents.macos.runners.sleep import SleepRunner

        runners["sleep"] = SleepRunner()
    if "embedding" in config.kinds:
        runners["embedding"] = _embedding_runner(embedding_engine(config), torch_settings, mlx_settings)
    if "completion" in config.kinds:
        engine = completion_engine(config)
        if engine == "ollama":
            from minions.agents.macos.runners.ollama_completion import OllamaCompletionRunner

            runners["completion"] = OllamaCompletionRunner(
                config.ollama_host, config.allow_pull, parallel=config.ollama_parallel
            )
        else:
            runners["completion"] = _completion_runner(engine, torch_settings, mlx_settings, config.models)
    return runners


def _embedding_runner(engine: str, torch_settings: TorchSettings, mlx_settings: MLXSettings) -> Runner:
    if engine == "mlx":
        from minions.agents.macos.runners.mlx_embedding import MLXEmbeddingRunner

        return MLXEmbeddingRunner(mlx_settings)
    if engine == "auto":
        from minions.agents.macos.runners.backend_choice import EmbeddingBackends

        return EmbeddingBackends(torch_settings, mlx_settings)
    from minions.agents.macos.runners.embedding import EmbeddingRunner

    return EmbeddingRunner(torch_settings)


def _completion_runner(engine: str, torch_settings: TorchSettings, mlx_settings: MLXSettings,
                       models: tuple[str, ...]) -> Runner:
    if engine == "mlx":
        from minions.agents.macos.runners.mlx_completion import MLXCompletionRunner

        return MLXCompletionRunner(mlx_settings)
    if engine == "auto":
        from minions.agents.macos.runners.backend_choice import CompletionBackends

        return CompletionBackends(torch_settings, mlx_settings, models)
    from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner

    return TransformersCompletionRunner(torch_settings)
