"""torch settings shared by the runners that use it: device, threads, precision, memory cap."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from minions.logging import get_logger


@dataclass(frozen=True)
class TorchSettings:
    device: str = "cpu"
    threads: int | None = None
    mps_memory_fraction: float = 0.5  # also the memory cap for batch sizing on CUDA
    precision: str = "auto"  # auto (probe, see precision.py) or fp32, bf16, fp16 to force one
    min_cosine: float = 0.9999  # the accuracy gate of a faster precision, cosine to fp32
    generation_batch_size: int | None = None  # None: the device's default (transformers_completion.py)


_prepared = False
_lock = threading.Lock()

log = get_logger(__name__)


def prepare(settings: TorchSettings) -> Any:
    """Import torch (only now: it costs seconds) and apply process-wide settings once."""
    global _prepared
    import torch

    with _lock:
        if not _prepared:
            if settings.threads is not None:
                torch.set_num_threads(settings.threads)
            _quiet_transformers()
            if settings.device == "mps":
                # Unified memory is shared with the owner's apps: cap what torch may take.
                torch.mps.set_per_process_memory_fraction(settings.mps_memory_fraction)
            _prepared = True
    return torch


def place(model: Any, device: str, precision: str = "auto") -> Any:
    """The model on `device`, in eval mode, in `precision`: auto is fp16 on GPUs and fp32 on CPU
    (whatever dtype the checkpoint was saved in: recent transformers load it as stored)."""
    import torch

    model = model.to(device)
    if precision == "auto":
        precision = "fp16" if half_precision(device) else "fp32"
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return model.to(dtype).eval()


def load_pretrained(name: str, auto_class: str, what: str, device: str, precision: str = "auto") -> tuple[Any, Any]:
    """Tokenizer and model `name` (a local path, the bundled MiniLM or the Hugging Face cache),
    placed on `device`. A model that does not exist is a PermanentError (no retry elsewhere will
    find it); one that failed to load otherwise is a RunnerError (another machine may manage)."""
    import transformers

    from minions.agents.macos.runners import model_paths
    from minions.agents.macos.runners.base import PermanentError, RunnerError

    path = model_paths.resolve(name)
    log.info(f"{what}_model_loading", model=name, path=path, device=device)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        model: Any = getattr(transformers, auto_class).from_pretrained(path)
    except (OSError, ValueError) as exc:
        # ValueError: a malformed id or a model transformers cannot run; neither gets better.
        if isinstance(exc, ValueError) or model_paths.is_missing_model_error(exc):
            raise PermanentError(f"unknown {what} model {name!r}: {exc}") from exc
        raise RunnerError(f"cannot load {what} model {name!r}: {exc}") from exc
    return tokenizer, place(model, device, precision)


def half_precision(device: str) -> bool:
    """fp16 where it is fast and safe for inference (GPU kernels); never on CPU, where fp16
    matmuls are slow or unsupported."""
    return device in ("mps", "cuda")


def free_memory(device: str) -> None:
    """Hand cached allocator blocks back after a model is dropped."""
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "mps":
        torch.mps.empty_cache()


def _quiet_transformers() -> None:
    # Model loads draw tqdm bars on stderr: noise in the agent's JSON log lines.
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return
    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # untyped upstream
