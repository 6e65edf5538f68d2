"""The embedding batch size for this device: the largest that fits under the memory cap and still
speeds up, found once when a model is first loaded.

Sizes double from a small start. Each is timed on copies of a typical text (the best of TIMINGS
runs: a busy neighbour only ever slows a run down); growing stops after PATIENCE sizes in a row
that each bring less than MIN_GAIN more texts per second than the fastest so far (one flat step
can be noise, or a plateau before the next gain), or at a size that runs out of memory, that takes
the allocator above the cap, or that is already slow (an owner's machine must stay responsive
between batches: cancellation waits for the batch in flight). The size kept is the fastest one
measured, even if it was faster by less than MIN_GAIN: MIN_GAIN only decides whether doubling
again is worth trying.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minions.logging import get_logger

log = get_logger(__name__)

# Throughput must grow by this much for a doubled batch to be worth its memory.
MIN_GAIN = 1.10
# A batch taking longer than this delays a stop (owner back, lease lost) by as much.
MAX_BATCH_S = 2.0
# Runs timed per size, the fastest counted.
TIMINGS = 2
# Sizes in a row without MIN_GAIN before growing stops.
PATIENCE = 2
START = {"cpu": 8, "mps": 16, "cuda": 32}
LARGEST = {"cpu": 256, "mps": 512, "cuda": 2048}
# About 40 tokens: a typical sentence or short paragraph in an embedding task.
TYPICAL_TEXT = (
    "Idle laptops embed documents overnight while their owners sleep; the queue hands each executor "
    "a lease, and heartbeats keep it alive until the results land in object storage."
)


@dataclass(frozen=True)
class Sizing:
    batch_size: int
    rates: dict[int, float]  # texts per second, per size tried
    why: str


def memory_cap_bytes(torch: Any, device: str, fraction: float) -> int | None:
    """The most the allocator may hold: `fraction` of the GPU (or of what MPS recommends);
    None on CPU, where batches of text are small next to the machine's memory."""
    if device == "cuda":
        return int(torch.cuda.get_device_properties(0).total_memory * fraction)
    if device == "mps":
        return int(torch.mps.recommended_max_memory() * fraction)
    return None


def allocated_bytes(torch: Any, device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    if device == "mps":
        return int(torch.mps.driver_allocated_memory())
    return 0


def out_of_memory(exc: BaseException) -> bool:
    return "out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"


def choose(
    torch: Any,
    device: str,
    embed: Callable[[list[str]], Any],
    memory_fraction: float,
    stop: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Sizing:
    """The batch size to embed with on `device` (see the module's docstring). `clock` times the runs
    (seconds)."""
    cap = memory_cap_bytes(torch, device, memory_fraction)
    size = START.get(device, 8)
    largest = LARGEST.get(device, 256)
    embed([TYPICAL_TEXT] * size)  # warm-up: the first call pays for kernel selection
    best, best_rate = size, 0.0
    flat = 0  # sizes in a row without MIN_GAIN over the fastest so far
    rates: dict[int, float] = {}
    why = f"largest tried ({largest})"
    while size <= largest:
        seconds = math.inf
        try:
            for _ in range(TIMINGS):
                if stop is not None:
                    stop()
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                started = clock()
                embed([TYPICAL_TEXT] * size)
                seconds = min(seconds, clock() - started)
                if seconds > MAX_BATCH_S:
                    break  # slow already: once is enough to know
        except RuntimeError as exc:
            if not out_of_memory(exc):
                raise
            why = f"out of memory at {size}"
            break
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        if cap is not None and allocated_bytes(torch, device) > cap:
            why = f"memory cap reached at {size}"
            break
        rate = size / max(seconds, 1e-9)
        rates[size] = round(rate, 1)
        flat = 0 if rate >= best_rate * MIN_GAIN else flat + 1
        if rate > best_rate:
            best, best_rate = size, rate
        if flat >= PATIENCE:
            why = f"less than {MIN_GAIN:.2f}x over the fastest for {PATIENCE} sizes up to {size}"
            break
        if seconds > MAX_BATCH_S:
            why = f"a batch of {size} takes {seconds:.1f} s"
            break
        size *= 2
    # JSON log lines need string keys.
    per_size = {str(size): rate for size, rate in rates.items()}
    log.info("embedding_batch_size_chosen", device=device, batch_size=best, rates=per_size, why=why)
    return Sizing(best, rates, why)


# A precision probe's timed run at most this long: the variants are timed several rounds each at load.
TIMING_RUN_S = 0.25


def timing_size(sizing: Sizing) -> int:
    """The batch size to time precisions at: the one chosen, or the largest size measured whose run
    took at most TIMING_RUN_S (a CPU's chosen batch can take seconds, and the probe times each
    variant at least seven times); at least 1."""
    fitting = [size for size, rate in sizing.rates.items() if rate > 0 and size / rate <= TIMING_RUN_S]
    if sizing.batch_size in fitting or not sizing.rates:
        return sizing.batch_size
    return max(fitting, default=min(sizing.rates))
