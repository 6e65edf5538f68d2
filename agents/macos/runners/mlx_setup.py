"""MLX settings shared by the MLX runners: whether MLX is installed, the memory cap, and where a
model's files are.

MLX (Apple's array framework) runs on the Apple GPU with unified memory; its Linux build (`mlx[cpu]`)
runs the same code on the CPU, which is what the parity tests use. It is an optional extra: nothing
here imports it before a runner needs it.

The memory cap is the MLX counterpart of torch's MPS cap (`mps_memory_fraction`, the same setting):
MLX may take that share of the memory the device recommends for its working set (of the machine's
RAM on the CPU build), its buffer cache no more than that either, and a model whose weights alone
would not fit under the cap is refused at load with the reason, not run into an allocation failure
in the middle of a subtask.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minions.agents.macos.runners import model_paths
from minions.agents.macos.runners.base import PermanentError, RunnerError
from minions.logging import get_logger

log = get_logger(__name__)

EXTRA_HINT = "pip install 'minions[mlx]'"
MISSING = f"needs the [mlx] extra (mlx, mlx-lm), which is not installed here: {EXTRA_HINT}"
# What an MLX runner reads of a Hugging Face repository (no PyTorch .bin, ONNX or GGUF copies).
MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "tokenizer*"]
_lock = threading.Lock()
_capped: float | None = None


class MLXMissing(RuntimeError):
    """`--backend mlx` on a machine without the `[mlx]` extra."""


@dataclass(frozen=True)
class MLXSettings:
    memory_fraction: float = 0.5  # the agent's mps_memory_fraction: the same cap for both engines
    precision: str = "auto"  # auto (fp32 on the CPU build, fp16 on the Apple GPU if it keeps the gate)
    min_cosine: float = 0.9999
    generation_batch_size: int | None = None


def available() -> bool:
    """Whether both MLX packages of the `[mlx]` extra are importable (without importing them)."""
    return importlib.util.find_spec("mlx") is not None and importlib.util.find_spec("mlx_lm") is not None


def require() -> None:
    if not available():
        raise MLXMissing(f"the mlx backend {MISSING}")


def import_mlx_lm() -> Any:
    """mlx_lm, imported without one side effect: mlx_lm.utils sets the process's open-file limit to
    (2048, 4096) at import, which lowers it where it was higher (a Linux box's 20,000), and a lowered
    hard limit cannot be raised again without privileges; every process started after inherits it
    (the replica drill's HAProxy in the same test run failed so). While it imports, a call to lower
    the limit keeps the one the process has; one raising the soft limit (macOS starts at 256) is
    honoured within the hard limit."""
    import resource

    with _lock:
        real_setrlimit = resource.setrlimit

        def never_lower(which: int, limits: tuple[int, int]) -> None:
            if which != resource.RLIMIT_NOFILE:
                real_setrlimit(which, limits)
                return
            soft, hard = resource.getrlimit(which)
            infinite = resource.RLIM_INFINITY
            if soft != infinite and limits[0] > soft:
                real_setrlimit(which, (limits[0] if hard == infinite else min(limits[0], hard), hard))

        resource.setrlimit = never_lower
        try:
            import mlx_lm
        finally:
            resource.setrlimit = real_setrlimit
    return mlx_lm


def prepare(settings: MLXSettings) -> Any:
    """Import mlx.core (only now) and apply the memory cap, once per process."""
    global _capped
    require()
    import mlx.core as mx

    with _lock:
        if _capped != settings.memory_fraction:
            cap = memory_cap_bytes(mx, settings.memory_fraction)
            mx.set_memory_limit(cap)
            mx.set_cache_limit(cap)
            log.info("mlx_memory_cap", cap_bytes=cap, fraction=settings.memory_fraction, device=device_name(mx))
            _capped = settings.memory_fraction
    return mx


def device_name(mx: Any) -> str:
    """`gpu` on Apple silicon (Metal), `cpu` on MLX's CPU build."""
    return "gpu" if mx.metal.is_available() else "cpu"


def memory_cap_bytes(mx: Any, fraction: float) -> int:
    """`fraction` of what the Apple GPU recommends as its working set, or of the machine's RAM."""
    info: dict[str, Any] = dict(mx.device_info()) if hasattr(mx, "device_info") else {}
    total = info.get("max_recommended_working_set_size") or info.get("memory_size") or _ram_bytes()
    return int(int(total) * fraction)


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def model_folder(name: str, what: str) -> Path:
    """The local folder of model `name`: a path, the bundled MiniLM, or a Hugging Face id from the
    cache, downloaded there on first use as transformers does (its weights in safetensors, config and
    tokenizer files only; never with HF_HUB_OFFLINE=1). A name that cannot be a model is a
    PermanentError; one not reachable now a RunnerError (another executor may hold it)."""
    resolved = model_paths.resolve(name)
    folder = Path(resolved).expanduser()
    if folder.is_dir():
        return folder
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise RunnerError(f"{what} model {name!r} is not a folder on this machine") from exc
    try:
        return Path(snapshot_download(resolved, allow_patterns=MODEL_FILES))
    except Exception as exc:  # the hub's errors: unknown id, not cached while offline, network
        if model_paths.is_missing_model_error(exc):
            raise PermanentError(f"unknown {what} model {name!r}: {exc}") from exc
        raise RunnerError(f"cannot fetch {what} model {name!r}: {exc}") from exc


def weight_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def check_fits(mx: Any, folder: Path, name: str, settings: MLXSettings) -> None:
    """Refuse a model whose weights alone exceed the memory cap (a clear reason at load, not an
    allocation failure mid-subtask). Retryable: a machine with more memory may serve it."""
    needed = weight_bytes(folder)
    cap = memory_cap_bytes(mx, settings.memory_fraction)
    if needed > cap:
        raise RunnerError(
            f"model {name!r} does not fit: its weights take {needed / 2**30:.2f} GiB, more than the "
            f"{cap / 2**30:.2f} GiB MLX may use here ({settings.memory_fraction:g} of the device's memory; "
            "raise --mps-memory-fraction to allow more)"
        )


def quantization(config: dict[str, Any]) -> str | None:
    """`4-bit g64` for an MLX-quantized folder (mlx-community's converters write `quantization` into
    config.json), else None."""
    q = config.get("quantization") or config.get("quantization_config")
    if not isinstance(q, dict) or "bits" not in q:
        return None
    return f"{q['bits']}-bit g{q.get('group_size', 64)}"
