"""Which precision a model runs in on this device: the fastest one that keeps its vectors.

At model load the embedding runner embeds a fixed probe batch in fp32 and in each faster precision
this device supports natively (bf16 on CPUs with AVX512-BF16 or AMX, fp16 on MPS and CUDA, bf16 on
CUDA where supported), times each, and keeps the fastest whose vectors stay at cosine >= a gate
(0.9999 by default) to fp32's; otherwise fp32. A precision the device only emulates is never tried:
it is slower than fp32 (bf16 on an AVX2 CPU is), so it could only lose. MINIONS_NATIVE_BF16=1 or 0
overrides what /proc/cpuinfo says (a VM that hides the flag, or a test of either kind of machine).

The timing must not flip on one noisy sample (a busy neighbour once made fp32 read 111 ms against
bf16's 49 on a machine where the two are equal): the variants are timed in alternating rounds (the
order reversed every round, so drift hits both alike), for at least MIN_ROUNDS rounds and until each
has run PROBE_BUDGET_S, and a faster precision is kept only if it beats fp32 by MIN_SPEED_UP in the
median of the rounds' ratios *and* in at least MIN_WON_SHARE of the rounds. Otherwise fp32 stays.

How a precision is applied: on CPU, bf16 runs under autocast (matmuls in bf16, layer norms and
softmax in fp32, the weights stay fp32); on GPUs the weights are cast (fp16/bf16 kernels are what
makes them fast).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minions.logging import get_logger

log = get_logger(__name__)

PRECISIONS = ("fp32", "bf16", "fp16")
PRECISION_SETTINGS = ("auto", *PRECISIONS)
DEFAULT_MIN_COSINE = 0.9999
# A faster precision must beat fp32 by this much (median of the paired rounds' ratios) to be worth
# any loss of accuracy at all, and in at least this share of the rounds (one lucky round is noise).
MIN_SPEED_UP = 1.15
MIN_WON_SHARE = 0.75
MIN_ROUNDS, MAX_ROUNDS = 7, 25
PROBE_BUDGET_S = 0.5  # per variant: short probes on a GPU get more rounds, not a longer load
NATIVE_BF16_ENV = "MINIONS_NATIVE_BF16"

# Varied on purpose (lengths, scripts, code, numbers): the gate must hold on more than prose.
PROBE_TEXTS = (
    "A cat sits on the mat.",
    "Machine learning models turn text into vectors that can be compared by cosine similarity.",
    "Idle laptops embed documents overnight while their owners sleep.",
    "UPPERCASE SHOUTING TEXT!!! and numbers 1234567890 with symbols #$%&*()",
    "Ünïcödé àccents, naïve café, façade.",
    "日本語のテキストも埋め込みます。",
    "Русский текст тоже работает.",
    "def add(a, b):\n    return a + b",
    "SELECT * FROM subtasks WHERE state = 'pending' ORDER BY id LIMIT 8;",
    "https://example.com/path?query=1&other=2",
    "a",
    "The quick brown fox jumps over the lazy dog, again and again, until the dog finally wakes up "
    "and wonders why anyone would write such a long sentence about a fox in a test of precision.",
    "Heartbeats keep a lease alive; the watchdog takes back the work of silent executors.",
    "Results land in object storage exactly once, whatever the number of attempts.",
    "Emoji are tokens too 🚀🔥✨",
    "Postgres decides who wins every claim.",
)


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (x86 AVX512-BF16 or AMX-BF16); MINIONS_NATIVE_BF16
    (1 or 0) overrides the answer."""
    forced = os.environ.get(NATIVE_BF16_ENV, "").strip()
    if forced in ("1", "0"):
        return forced == "1"
    if forced:
        raise ValueError(f"{NATIVE_BF16_ENV} must be 1 or 0, not {forced!r}")
    if platform.system() != "Linux":
        return False  # macOS runs torch work on MPS; its CPU path is not worth a bf16 probe
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def candidates(device: str, torch: Any) -> list[str]:
    """The precisions faster than fp32 that `device` supports natively, to be probed."""
    if device == "cpu":
        return ["bf16"] if cpu_has_native_bf16() else []
    if device == "cuda":
        return ["fp16", "bf16"] if torch.cuda.is_bf16_supported() else ["fp16"]
    if device == "mps":
        return ["fp16"]
    return []


def torch_dtype(torch: Any, precision: str) -> Any:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@dataclass
class Precise:
    """A model in one precision: the module to call and the context to call it in."""

    precision: str
    model: Any
    autocast_dtype: Any = None  # CPU bf16: autocast around each forward
    device: str = "cpu"

    def context(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(device_type=self.device, dtype=self.autocast_dtype)


def apply(torch: Any, model: Any, device: str, precision: str) -> Precise:
    """`model` (fp32) run in `precision`. On a GPU the fp32 model is kept untouched: the cast is a
    copy, so a precision that fails the gate costs nothing to drop."""
    if precision == "fp32":
        return Precise("fp32", model, device=device)
    dtype = torch_dtype(torch, precision)
    if device == "cpu":
        return Precise(precision, model, autocast_dtype=dtype, device=device)
    import copy

    return Precise(precision, copy.deepcopy(model).to(dtype), device=device)


@dataclass(frozen=True)
class Choice:
    """The precision chosen for one model on this device, and why."""

    model: str
    device: str
    precision: str
    cosine: float  # the minimum cosine to fp32 over the probe batch (1.0 for fp32 itself)
    setting: str  # auto, or the precision forced by --precision
    measured: dict[str, dict[str, float]] = field(default_factory=dict)  # per precision: cosine, ms

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "precision": self.precision,
            "cosine": round(self.cosine, 7),
            "setting": self.setting,
        }


Embed = Callable[[Precise, list[str]], Any]  # normalised vectors (a float32 tensor on the CPU)


def choose(
    torch: Any,
    model_name: str,
    model: Any,
    device: str,
    embed: Embed,
    setting: str = "auto",
    min_cosine: float = DEFAULT_MIN_COSINE,
    stop: Callable[[], None] | None = None,
) -> tuple[Precise, Choice]:
    """Probe and choose (see the module's docstring). `setting` other than auto forces that
    precision; its cosine is still measured and logged."""
    texts = list(PROBE_TEXTS)
    fp32 = apply(torch, model, device, "fp32")
    reference = embed(fp32, texts)
    if setting != "auto":
        if setting == "fp32":
            choice = Choice(model_name, device, "fp32", 1.0, setting)
            _log(choice, "forced")
            return fp32, choice
        forced = apply(torch, model, device, setting)
        cosine = min_row_cosine(torch, embed(forced, texts), reference)
        if cosine < min_cosine:
            log.warning("precision_below_gate", model=model_name, precision=setting, cosine=cosine,
                        min_cosine=min_cosine)
        choice = Choice(model_name, device, setting, cosine, setting, {setting: {"cosine": cosine}})
        _log(choice, "forced")
        return forced, choice
    tried = candidates(device, torch)
    if not tried:
        choice = Choice(model_name, device, "fp32", 1.0, setting)
        _log(choice, "no faster precision on this device")
        return fp32, choice
    variants = {"fp32": fp32}
    measured: dict[str, dict[str, float]] = {"fp32": {"cosine": 1.0}}
    for name in tried:
        if stop is not None:
            stop()
        precise = variants[name] = apply(torch, model, device, name)
        measured[name] = {"cosine": min_row_cosine(torch, embed(precise, texts), reference)}
    timings = time_alternating({name: functools.partial(embed, p, texts) for name, p in variants.items()}, stop)
    for name, figures in summarize(timings).items():
        measured[name].update(figures)
    best = select(measured, min_cosine)
    choice = Choice(model_name, device, best, measured[best]["cosine"], setting, measured)
    _log(choice, "fastest within the gate" if best != "fp32" else "no clearly faster precision within the gate")
    return variants[best], choice


def select(measured: dict[str, dict[str, float]], min_cosine: float) -> str:
    """The fastest precision whose cosine to fp32 is >= min_cosine and that beats fp32 clearly (its
    `speed_up`, the median of the rounds' fp32/its ratios, >= MIN_SPEED_UP, and faster by that margin
    in a `won` share >= MIN_WON_SHARE of the rounds); fp32 when none does. `measured`: per precision,
    its cosine, median ms, speed_up and won (see summarize)."""
    best, best_ms = "fp32", math.inf
    for name, figures in measured.items():
        if name == "fp32" or figures["cosine"] < min_cosine:
            continue
        clear = figures["speed_up"] >= MIN_SPEED_UP and figures["won"] >= MIN_WON_SHARE
        if clear and figures["ms"] < best_ms:
            best, best_ms = name, figures["ms"]
    return best


def time_alternating(runs: dict[str, Callable[[], Any]], stop: Callable[[], None] | None = None,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Milliseconds of each run per round, after one warm-up call each. Rounds alternate the order
    (forward, then reversed) so that a load that comes and goes weighs on every variant alike; there
    are at least MIN_ROUNDS and, while any variant has run less than PROBE_BUDGET_S, up to MAX_ROUNDS."""
    names = list(runs)
    for name in names:
        if stop is not None:
            stop()
        runs[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(MAX_ROUNDS):
        if index >= MIN_ROUNDS and min(sum(t) for t in times.values()) >= PROBE_BUDGET_S * 1000:
            break
        for name in names if index % 2 == 0 else reversed(names):
            if stop is not None:
                stop()
            started = clock()
            runs[name]()
            times[name].append((clock() - started) * 1000)
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per variant: its median ms, its speed_up over fp32 (the median of the rounds' fp32 / its ms)
    and the share of rounds it `won` (faster than fp32 by MIN_SPEED_UP in that round)."""
    fp32 = times["fp32"]
    out: dict[str, dict[str, float]] = {}
    for name, ms in times.items():
        ratios = [base / max(own, 1e-9) for base, own in zip(fp32, ms, strict=True)]
        out[name] = {
            "ms": round(statistics.median(ms), 3),
            "speed_up": round(statistics.median(ratios), 3),
            "won": round(sum(r >= MIN_SPEED_UP for r in ratios) / len(ratios), 3),
            "rounds": len(ms),
        }
    return out


def min_row_cosine(torch: Any, vectors: Any, reference: Any) -> float:
    """The smallest cosine between matching rows (the worst text, not the average)."""
    a = torch.nn.functional.normalize(vectors.float(), dim=1)
    b = torch.nn.functional.normalize(reference.float(), dim=1)
    return float((a * b).sum(dim=1).min())


def _log(choice: Choice, why: str) -> None:
    log.info(
        "precision_chosen",
        model=choice.model,
        device=choice.device,
        precision=choice.precision,
        cosine=choice.cosine,
        setting=choice.setting,
        measured=choice.measured,
        why=why,
    )

