"""Which precision a model runs in on this device: the fastest one that keeps its vectors.

At model load the embedding runner embeds a fixed probe batch in fp32 and in each faster variant
this device supports natively, times each, and keeps the fastest whose vectors stay at cosine >= a
gate (0.9999 by default) to fp32's; otherwise fp32. A variant is a precision and how its weights
are held: on CPUs with AVX512-BF16 or AMX, bf16 under autocast over the fp32 weights (matmuls in
bf16, layer norms and softmax in fp32) and bf16 weights (`model.to(torch.bfloat16)`: everything in
bf16, less memory traffic; often the faster of the two, sometimes the less accurate); on MPS fp16
weights; on CUDA fp16 weights and bf16 weights where supported. A precision the device only
emulates is never tried: it is slower than fp32 (bf16 on an AVX2 CPU is), so it could only lose.
MINIONS_NATIVE_BF16=1 or 0 overrides what /proc/cpuinfo says (a VM that hides the flag, or a test
of either kind of machine).

The timing must not flip on one noisy sample (a busy neighbour once made fp32 read 111 ms against
bf16's 49 on a machine where the two are equal): the variants are timed in alternating rounds (the
order reversed every round, so drift hits both alike), for at least MIN_ROUNDS rounds and until each
has run PROBE_BUDGET_S, and a faster precision is kept only if it beats fp32 by MIN_SPEED_UP in the
median of the rounds' ratios *and* in at least MIN_WON_SHARE of the rounds. Otherwise fp32 stays.
Of the variants that pass, the one with the largest median ratio to fp32 is kept.

Only one copy of the weights outlives the choice: a cast variant is built next to the fp32 model
(which the probe needs as its reference) parameter by parameter, never as a second fp32 copy, and
whichever variant loses is dropped when the choice returns; the caller then drops its fp32 model
when the chosen variant does not use it (Precise.weights says which).
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
# How a variant holds its weights: fp32 as loaded, fp32 under autocast, or cast to its precision.
WEIGHTS = ("fp32", "autocast", "bf16", "fp16")
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


@dataclass(frozen=True)
class Variant:
    """A precision and how the weights are held for it (one of WEIGHTS)."""

    precision: str
    weights: str

    @property
    def name(self) -> str:
        """fp32, bf16-autocast, bf16-weights, fp16-weights: the key of its figures in Choice.measured."""
        if self.precision == "fp32":
            return "fp32"
        return f"{self.precision}-{'autocast' if self.weights == 'autocast' else 'weights'}"


FP32 = Variant("fp32", "fp32")


def variants_of(device: str, precision: str) -> list[Variant]:
    """The ways `device` can run `precision`: on CPU under autocast and with cast weights, on a GPU
    with cast weights (its fp16/bf16 kernels are what makes it fast)."""
    if precision == "fp32":
        return [FP32]
    if device == "cpu":
        return [Variant(precision, "autocast"), Variant(precision, precision)]
    return [Variant(precision, precision)]


def candidates(device: str, torch: Any) -> list[Variant]:
    """The variants faster than fp32 that `device` supports natively, to be probed."""
    if device == "cpu":
        return variants_of(device, "bf16") if cpu_has_native_bf16() else []
    if device == "cuda":
        precisions = ["fp16", "bf16"] if torch.cuda.is_bf16_supported() else ["fp16"]
        return [v for p in precisions for v in variants_of(device, p)]
    if device == "mps":
        return variants_of(device, "fp16")
    return []


def torch_dtype(torch: Any, precision: str) -> Any:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@dataclass
class Precise:
    """A model in one precision: the module to call and the context to call it in."""

    precision: str
    model: Any
    autocast_dtype: Any = None  # autocast around each forward (the weights stay fp32)
    device: str = "cpu"
    weights: str = "fp32"  # one of WEIGHTS
    def context(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(device_type=self.device, dtype=self.autocast_dtype)


def apply(torch: Any, model: Any, device: str, variant: Variant) -> Precise:
    """`model` (fp32) run as `variant`. The fp32 model is kept untouched: a cast is a copy, so a
    variant that fails the gate costs nothing to drop."""
    if variant.precision == "fp32":
        return Precise("fp32", model, device=device)
    dtype = torch_dtype(torch, variant.precision)
    if variant.weights == "autocast":
        return Precise(variant.precision, model, autocast_dtype=dtype, device=device, weights="autocast")
    return Precise(variant.precision, cast_copy(torch, model, dtype), device=device, weights=variant.weights)


def cast_copy(torch: Any, model: Any, dtype: Any) -> Any:
    """A copy of `model` with its floating-point parameters and buffers in `dtype`, built tensor by
    tensor: memory grows by the cast copy only, not by a second fp32 model first (as
    `copy.deepcopy(model).to(dtype)` would). Tied weights stay tied (deepcopy's memo)."""
    import copy

    memo: dict[int, Any] = {}
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and id(param) not in memo:
                memo[id(param)] = torch.nn.Parameter(param.detach().to(dtype), requires_grad=False)
        for buffer in model.buffers():
            if buffer.is_floating_point() and id(buffer) not in memo:
                memo[id(buffer)] = buffer.detach().to(dtype)
    return copy.deepcopy(model, memo)


@dataclass(frozen=True)
class Choice:
    """The precision chosen for one model on this device, and why."""

    model: str
    device: str
    precision: str
    cosine: float  # the minimum cosine to fp32 over the probe batch (1.0 for fp32 itself)
    setting: str  # auto, or the precision forced by --precision
    measured: dict[str, dict[str, float]] = field(default_factory=dict)  # per variant name: cosine, ms...
    weights: str = "fp32"  # how the weights are held (one of WEIGHTS)
    timed_batch: int | None = None  # the batch size the variants were timed at (None: not timed)

    @property
    def variant(self) -> str:
        """The name of the chosen variant, its key in `measured`."""
        return Variant(self.precision, self.weights).name

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "precision": self.precision,
            "weights": self.weights,
            "cosine": round(self.cosine, 7),
            "setting": self.setting,
            **({"timed_batch": self.timed_batch} if self.timed_batch is not None else {}),
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
    timing_texts: list[str] | None = None,
) -> tuple[Precise, Choice]:
    """Probe and choose (see the module's docstring). `setting` other than auto forces that
    precision (the faster of its variants on this device where it has two); its cosine is still
    measured and logged. The cosine gate is read on the probe texts; the variants are timed on
    `timing_texts` when given (a batch of the size the runner will use: a GPU's gain from fp16 at
    batch 512 is not its gain at a probe of a dozen texts), else on the probe texts."""
    texts = list(PROBE_TEXTS)
    timed = timing_texts or texts
    fp32 = apply(torch, model, device, FP32)
    reference = embed(fp32, texts)
    if setting == "fp32":
        choice = Choice(model_name, device, "fp32", 1.0, setting)
        _log(choice, "forced")
        return fp32, choice
    if setting != "auto":
        tried = variants_of(device, setting)
    else:
        tried = candidates(device, torch)
        if not tried:
            choice = Choice(model_name, device, "fp32", 1.0, setting)
            _log(choice, "no faster precision on this device")
            return fp32, choice
    variants: dict[str, Precise] = {} if setting != "auto" else {"fp32": fp32}
    measured: dict[str, dict[str, float]] = {} if setting != "auto" else {"fp32": {"cosine": 1.0}}
    for variant in tried:
        if stop is not None:
            stop()
        precise = variants[variant.name] = apply(torch, model, device, variant)
        measured[variant.name] = {"cosine": min_row_cosine(torch, embed(precise, texts), reference)}
    timed_batch = len(timed) if len(variants) > 1 else None
    if len(variants) > 1:
        timings = time_alternating({name: functools.partial(embed, p, timed) for name, p in variants.items()}, stop)
        for name, figures in summarize(timings).items():
            measured[name].update(figures)
    if setting != "auto":
        best = min(measured, key=lambda name: measured[name].get("ms", 0.0))
        why = "forced"
        if measured[best]["cosine"] < min_cosine:
            log.warning("precision_below_gate", model=model_name, precision=setting, variant=best,
                        cosine=measured[best]["cosine"], min_cosine=min_cosine)
    else:
        best = select(measured, min_cosine)
        why = "fastest within the gate" if best != "fp32" else "no clearly faster precision within the gate"
    chosen = variants[best]
    variants.clear()  # the losers' cast copies go now, not when the caller drops the choice
    choice = Choice(model_name, device, chosen.precision, measured[best]["cosine"], setting, measured,
                    chosen.weights, timed_batch)
    _log(choice, why)
    return chosen, choice


def select(measured: dict[str, dict[str, float]], min_cosine: float) -> str:
    """The fastest variant whose cosine to fp32 is >= min_cosine and that beats fp32 clearly (its
    `speed_up`, the median of the rounds' fp32/its ratios, >= MIN_SPEED_UP, and faster by that margin
    in a `won` share >= MIN_WON_SHARE of the rounds); fp32 when none does. `measured`: per variant,
    its cosine, median ms, speed_up and won (see summarize). Variants are ranked by speed_up (paired
    with fp32 round by round, so steadier on a noisy machine than their own medians), then ms."""
    best, best_key = "fp32", (1.0, -math.inf)
    for name, figures in measured.items():
        if name == "fp32" or figures["cosine"] < min_cosine:
            continue
        clear = figures["speed_up"] >= MIN_SPEED_UP and figures["won"] >= MIN_WON_SHARE
        key = (figures["speed_up"], -figures["ms"])
        if clear and key > best_key:
            best, best_key = name, key
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
    and the share of rounds it `won` (faster than fp32 by MIN_SPEED_UP in that round). Without an
    fp32 variant (a forced precision's variants) the first one is the base."""
    fp32 = times["fp32"] if "fp32" in times else next(iter(times.values()))
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
        weights=choice.weights,
        cosine=choice.cosine,
        setting=choice.setting,
        measured=choice.measured,
        why=why,
    )

