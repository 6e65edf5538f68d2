"""Which engine runs each model: torch (transformers) or MLX, chosen by measurement like precision.

`--backend auto` on Apple silicon with the `[mlx]` extra installed loads a model in both engines once,
at its first load, and keeps the faster of those whose output passes the gate:
- embeddings: MLX's vectors must stay at cosine >= min_cosine (0.9999) to fp32 transformers' on the
  probe batch (precision.PROBE_TEXTS), whatever MLX runs (fp32, fp16, or a quantized conversion);
- completions: MLX's greedy output on a few probe prompts must be transformers' (same text, same
  number of tokens).
Both then run the same probe in alternating rounds (precision.time_alternating) and the lower median
wins; the other engine's copy of the model is dropped. A model MLX cannot load (another architecture,
weights that do not fit under the memory cap) is served by torch, and the reason is logged and
reported at registration, as is a model whose MLX output fails the gate.

Both engines' runners share one inference thread, so a model is only ever touched from it. Elsewhere
(`auto` off Apple silicon, or without the extra) the agent builds the torch runners alone
(registry.py) and nothing here runs.
"""

from __future__ import annotations

import asyncio
import platform
import statistics
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners import mlx_setup, model_paths, precision, torch_setup
from minions.agents.macos.runners.base import InferenceThread, Record, RunnerError, check_stop, require_model
from minions.agents.macos.runners.completion import CompletionParams
from minions.agents.macos.runners.embedding import EmbeddingParams, EmbeddingRunner
from minions.agents.macos.runners.mlx_completion import MLXCompletionRunner
from minions.agents.macos.runners.mlx_embedding import MLXEmbeddingRunner
from minions.agents.macos.runners.mlx_setup import MLXSettings
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner
from minions.logging import get_logger

log = get_logger(__name__)

PROBE_PROMPTS: tuple[Record, ...] = (
    {"id": "probe-1", "prompt": "The quick brown fox"},
    {"id": "probe-2", "prompt": "Idle laptops embed documents overnight while their owners sleep."},
    {"id": "probe-3", "messages": [{"role": "user", "content": "Why is the sky blue?"}]},
)
PROBE_COMPLETION = CompletionParams(temperature=0, max_tokens=16)
NOTE_CHARS = 240  # the longest reason reported at registration (the log has it whole)


def apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def compares_engines(backend: str) -> bool:
    """Whether `backend` makes the agent measure torch against MLX on this machine."""
    return backend == "auto" and apple_silicon() and mlx_setup.available()


def faster(runs: dict[str, Callable[[], Any]], stop: Callable[[], None] | None = None) -> tuple[str, dict[str, float]]:
    """The run with the lowest median time over alternating rounds, and each one's median ms."""
    times = precision.time_alternating(runs, stop)
    medians = {name: round(statistics.median(ms), 3) for name, ms in times.items()}
    return min(medians, key=lambda name: medians[name]), medians


class _Engine(Protocol):
    def unload(self) -> None: ...


class _Choices:
    """Per model: the engine chosen, why, and what was turned down (reported at registration)."""

    def __init__(self) -> None:
        self.backend: dict[str, str] = {}
        self.notes: dict[str, dict[str, Any]] = {}

    def keep(self, model: str, backend: str, why: str, loser: _Engine | None, rejected: str | None = None) -> str:
        if loser is not None:
            loser.unload()
        self.backend[model] = backend
        self.notes[model] = {"backend": backend, "why": why, **({"rejected": _short(rejected)} if rejected else {})}
        log.info("backend_chosen", model=model, backend=backend, why=why, rejected=rejected)
        return backend

    def refuse(self, model: str, why: str, loser: _Engine, rejected: str) -> None:
        """No engine may serve `model` (said at registration too); the next subtask measures again."""
        loser.unload()
        self.notes[model] = {"backend": None, "why": _short(why), "rejected": _short(rejected)}
        log.warning("backend_refused", model=model, why=why, rejected=rejected)


def _short(text: str) -> str:
    """A reason short enough for the registration's hardware (8 KiB of JSON for every model)."""
    return text if len(text) <= NOTE_CHARS else text[: NOTE_CHARS - 1] + "…"


def transformers_reference(name: str) -> Callable[[list[str]], Any]:
    """A function that embeds texts with transformers in fp32 on the CPU (mean pooling, L2 norm): the
    reference the gate compares MLX's vectors to, whatever precision the torch runner chose."""

    def embed(texts: list[str]) -> Any:
        import torch

        tokenizer, model = torch_setup.load_pretrained(name, "AutoModel", "embedding", "cpu", "fp32")
        try:
            with torch.inference_mode():
                encoded = tokenizer(texts, padding=True, truncation=True, return_tensors="pt",
                                    max_length=EmbeddingParams().max_length)
                hidden = model(**encoded)[0].float()
                mask = encoded["attention_mask"].unsqueeze(-1).float()
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
        finally:
            del model

    return embed


class _Backends:
    """What both kinds share: one inference thread for both engines' runners, the choice per model
    (`choose`, each kind's own), and the calls routed to the chosen engine's runner."""

    _thread: InferenceThread
    _torch: Any
    _mlx: Any

    def __init__(self) -> None:
        self._choices = _Choices()

    def choose(self, model: str, stop: threading.Event | None = None) -> str:
        raise NotImplementedError

    def chosen(self, model: str) -> str | None:
        return self._choices.backend.get(model)

    async def prepare(self, model_name: str) -> str:
        return await self._thread.call(lambda stop: self.choose(model_name, stop))

    async def fingerprints(self, models: Sequence[str]) -> list[dict[str, Any]]:
        on_mlx = [m for m in models if self.chosen(m) == "mlx"]
        rest = [m for m in models if m not in on_mlx]
        return [*(await self._mlx.fingerprints(on_mlx) if on_mlx else []), *await self._torch.fingerprints(rest)]

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        model = require_model(subtask)
        backend = await self._thread.call(lambda stop: self.choose(model, stop))
        runner: Any = self._mlx if backend == "mlx" else self._torch
        return await runner.run(subtask, records)  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        self._thread.shutdown()

    def _keep_faster(self, model: str, probe: Callable[[Any], Any], stop: threading.Event | None) -> str:
        """Both engines passed the gate: the one with the lower median over alternating probe rounds
        is kept, the other's copy of the model dropped."""
        best, medians = faster({"torch": lambda: probe(self._torch), "mlx": lambda: probe(self._mlx)},
                               lambda: check_stop(stop))
        why = f"faster: {', '.join(f'{k} {v:g} ms' for k, v in medians.items())} per probe batch"
        return self._choices.keep(model, best, why, self._torch if best == "mlx" else self._mlx)


class EmbeddingBackends(_Backends):
    """The `embedding` kind served by torch or MLX per model (see the module's docstring)."""

    kind = "embedding"

    def __init__(self, torch_settings: TorchSettings, mlx_settings: MLXSettings) -> None:
        super().__init__()
        self._thread = InferenceThread("embedding")
        self._torch = EmbeddingRunner(torch_settings, self._thread)
        self._mlx = MLXEmbeddingRunner(mlx_settings, self._thread)
        self._min_cosine = mlx_settings.min_cosine

    def precision_reports(self) -> list[dict[str, Any]]:
        reports = []
        for model, notes in self._choices.notes.items():
            runner: Any = self._mlx if notes["backend"] == "mlx" else self._torch
            own = next((r for r in runner.precision_reports() if r["model"] == model), {"model": model})
            reports.append({**own, **notes})
        return reports

    async def advertised_models(self) -> list[str]:
        return [model_paths.MINILM] if model_paths.bundled_minilm_available() else []

    def choose(self, model: str, stop: threading.Event | None = None) -> str:
        """The engine for `model`, measured at its first call. Blocking: on the inference thread."""
        if (known := self.chosen(model)) is not None:
            return known
        texts = list(precision.PROBE_TEXTS)
        params = EmbeddingParams()
        reference: Callable[[list[str]], Any] | None = None
        torch_failed: Exception | None = None
        try:
            self._torch.encode(model, texts, params, stop)  # loads it, choosing torch's precision
            reference = transformers_reference(model)
        except (RunnerError, RuntimeError) as exc:  # RuntimeError: weights transformers cannot read
            torch_failed = exc
        try:
            report = self._mlx.load(model, stop, reference=reference).report
        except RunnerError as exc:
            if torch_failed is not None:
                raise torch_failed from exc  # unknown model, or one neither engine reads
            return self._choices.keep(model, "torch", "MLX cannot serve it", None, rejected=f"mlx: {exc}")
        refused = gate_refusal(report, self._min_cosine)
        if refused is not None:
            log.warning("mlx_below_gate", model=model, cosine=report["cosine"], min_cosine=self._min_cosine,
                        quantization=report.get("quantization"))
            if torch_failed is not None:
                self._choices.refuse(model, f"transformers cannot load it: {torch_failed}", self._mlx, refused)
                raise RunnerError(f"embedding model {model!r}: transformers cannot load it and MLX's vectors "
                                  f"cannot be shown within the gate ({refused})") from torch_failed
            return self._choices.keep(model, "torch", "MLX's vectors fail the gate", self._mlx, rejected=refused)
        return self._keep_faster(model, lambda runner: runner.encode(model, texts, params, stop), stop)


def gate_refusal(report: dict[str, Any], min_cosine: float) -> str | None:
    """Why MLX's vectors (its load report) may not serve a model under auto, or None when they pass:
    cosine >= min_cosine to fp32 transformers, which must be known."""
    cosine = report.get("cosine")
    quantized = f" ({report['quantization']})" if report.get("quantization") else ""
    if cosine is None:
        return f"mlx{quantized}: no fp32 transformers reference to compare its vectors with"
    if cosine < min_cosine:
        return f"mlx{quantized}: cosine {cosine} to fp32 transformers, below {min_cosine}"
    return None


class CompletionBackends(_Backends):
    """The `completion` kind served by transformers or mlx-lm per model (see the module's docstring).
    `models`: the configured models to choose for at start (those on this machine), so that the choice
    is reported at registration; others are measured at their first subtask."""

    kind = "completion"

    def __init__(self, torch_settings: TorchSettings, mlx_settings: MLXSettings, models: Sequence[str] = ()) -> None:
        super().__init__()
        self._thread = InferenceThread("completion")
        self._torch = TransformersCompletionRunner(torch_settings, self._thread)
        self._device = torch_settings.device
        self._mlx = MLXCompletionRunner(mlx_settings, self._thread)
        self._models = list(models)

    def precision_reports(self) -> list[dict[str, Any]]:
        return [{"model": model, "device": self._device if backend == "torch" else "mlx", "cosine": None,
                 "precision": None, "setting": "auto", **self._choices.notes[model]}
                for model, backend in self._choices.backend.items()]

    async def advertised_models(self) -> list[str]:
        """The configured models on this machine: a folder, or in the Hugging Face cache."""

        def local() -> list[str]:
            return [m for m in self._models
                    if Path(model_paths.resolve(m)).expanduser().is_dir() or model_paths.fingerprint(m) is not None]

        return await asyncio.to_thread(local)

    def choose(self, model: str, stop: threading.Event | None = None) -> str:
        """The engine for `model`, measured at its first call. Blocking: on the inference thread."""
        if (known := self.chosen(model)) is not None:
            return known
        records = list(PROBE_PROMPTS)
        reference = self._torch.generate(model, records, PROBE_COMPLETION, stop)
        try:
            got = self._mlx.generate(model, records, PROBE_COMPLETION, stop)
        except RunnerError as exc:
            return self._choices.keep(model, "torch", "MLX cannot serve it", None, rejected=f"mlx: {exc}")
        differ = [r["id"] for r, g in zip(reference, got, strict=True)
                  if (r["text"], r["usage"]) != (g["text"], g["usage"])]
        if differ:
            log.warning("mlx_tokens_differ", model=model, prompts=differ)
            return self._choices.keep(model, "torch", "MLX's greedy tokens differ from transformers'", self._mlx,
                                      rejected=f"mlx: greedy output differs on {', '.join(differ)}")
        return self._keep_faster(model, lambda runner: runner.generate(model, records, PROBE_COMPLETION, stop), stop)

