"""torch settings shared by the runners that use it: device, threads, precision, memory cap."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TorchSettings:
    device: str = "cpu"
    threads: int | None = None
    mps_memory_fraction: float = 0.5


_prepared = False
_lock = threading.Lock()


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


def place(model: Any, device: str) -> Any:
    """The model on `device`, in eval mode, fp16 on GPUs and fp32 on CPU (whatever dtype the
    checkpoint was saved in: recent transformers load it as stored)."""
    model = model.to(device)
    model = model.half() if half_precision(device) else model.float()
    return model.eval()


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
