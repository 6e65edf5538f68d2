"""The `embedding` kind on MLX: the BERT forward of mlx_bert.py, pooled and normalised as the torch
runner (embedding.py) does, so both answer the same vectors to within the precision gate.

A model runs in fp32 on MLX's CPU build; on the Apple GPU `auto` keeps fp16 when it is clearly
faster and its vectors stay within the gate of the fp32 forward (precision.py's rules). A quantized
folder (mlx-community's 4- and 8-bit conversions) runs as it is, and reports its quantisation.
Texts are sorted by length and the batch size is probed once at load (batch_sizing.py), as in the
torch runner.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners import batch_sizing, mlx_setup, model_paths, precision
from minions.agents.macos.runners.base import (
    InferenceThread,
    Record,
    RunnerError,
    check_stop,
    require_model,
    string_field,
)
from minions.agents.macos.runners.embedding import EmbeddingParams
from minions.agents.macos.runners.mlx_setup import MLXSettings
from minions.agents.macos.runners.model_identity import ModelIdentities
from minions.logging import get_logger

log = get_logger(__name__)
BACKEND = "mlx"
CPU_BATCH_SIZE = 32
# The reference vectors a choice is gated against (the fp32 transformers forward, when the agent
# compares backends); None: this runner's own fp32 forward.
Reference = Callable[[list[str]], Any]


class CannotLoad(RunnerError):
    """MLX cannot run this model (another architecture, no safetensors): torch may."""


@dataclass
class _Loaded:
    name: str
    tokenizer: Any
    model: Any
    dtype: Any  # the compute dtype of the activations
    report: dict[str, Any]
    batch_size: int


class MLXEmbeddingRunner:
    kind = "embedding"
    backend = BACKEND

    def __init__(self, settings: MLXSettings, thread: InferenceThread | None = None) -> None:
        self._settings = settings
        self._thread = thread or InferenceThread("mlx-embedding")
        self._loaded: _Loaded | None = None
        self._reports: dict[str, dict[str, Any]] = {}
        self._identities = ModelIdentities(BACKEND)

    def precision_reports(self) -> list[dict[str, Any]]:
        return list(self._reports.values())

    def report(self, model: str) -> dict[str, Any] | None:
        return self._reports.get(model)

    async def fingerprints(self, models: Sequence[str]) -> list[dict[str, Any]]:
        def chosen(model: str) -> str | None:
            report = self._reports.get(model)
            return None if report is None else str(report["precision"])

        return await self._thread.call(lambda stop: self._identities.reports(models, chosen))

    async def prepare(self, model_name: str) -> dict[str, Any]:
        return await self._thread.call(lambda stop: self.load(model_name, stop).report)

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        model = require_model(subtask)
        params = EmbeddingParams.parse(subtask.params)
        texts = [string_field(r, "text") for r in records]
        return await self._thread.call(lambda stop: self.records(model, records, texts, params, stop))

    def records(self, model: str, records: list[Record], texts: list[str], params: EmbeddingParams,
                stop: threading.Event | None) -> list[Record]:
        """Blocking: the output records of `records` (their `texts` embedded)."""
        import numpy as np

        vectors = self.encode(model, texts, params, stop)
        tokens = self.count_tokens(model, texts, params)
        return [{"id": r["id"], "embedding": np.asarray(v, dtype=np.float32), "usage": {"prompt_tokens": n}}
                for r, v, n in zip(records, vectors, tokens, strict=True)]

    def count_tokens(self, model_name: str, texts: list[str], params: EmbeddingParams) -> list[int]:
        encoded = self.load(model_name).tokenizer(texts, truncation=True, max_length=params.max_length)
        return [len(ids) for ids in encoded["input_ids"]]

    async def advertised_models(self) -> list[str]:
        return [model_paths.MINILM] if model_paths.bundled_minilm_available() else []

    async def aclose(self) -> None:
        self._thread.shutdown()

    def encode(self, model_name: str, texts: list[str], params: EmbeddingParams,
               stop: threading.Event | None = None) -> Any:
        """Vectors for `texts` in their order, a float32 numpy array. Blocking."""
        import numpy as np

        loaded = self.load(model_name, stop)
        size = params.batch_size or loaded.batch_size
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        vectors = np.zeros((len(texts), 0), dtype=np.float32)
        for start in range(0, len(order), size):
            check_stop(stop)
            batch = order[start : start + size]
            pooled = self._embed(loaded.tokenizer, loaded.model, loaded.dtype, [texts[i] for i in batch], params)
            if vectors.shape[1] == 0:
                vectors = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            vectors[batch] = pooled
        return vectors

    def _embed(self, tokenizer: Any, model: Any, dtype: Any, texts: list[str], params: EmbeddingParams) -> Any:
        import mlx.core as mx
        import numpy as np

        encoded = tokenizer(texts, padding=True, truncation=True, max_length=params.max_length, return_tensors="np")
        mask = mx.array(encoded["attention_mask"])
        types = mx.array(encoded["token_type_ids"]) if "token_type_ids" in encoded else None
        hidden = model(mx.array(encoded["input_ids"]), mask, types).astype(mx.float32)  # pool in fp32
        if params.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask[..., None].astype(mx.float32)
            pooled = (hidden * weights).sum(axis=1) / mx.maximum(weights.sum(axis=1), 1e-9)
        if params.normalize:
            pooled = pooled / mx.maximum(mx.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return np.array(pooled, dtype=np.float32)

    def load(self, name: str, stop: threading.Event | None = None, reference: Reference | None = None) -> _Loaded:
        """Load `name` (once; another model replaces it), choosing its precision. Blocking. Raises
        CannotLoad when MLX cannot run it, RunnerError when it does not fit under the memory cap."""
        if self._loaded is not None and self._loaded.name == name:
            return self._loaded
        self._loaded = None
        mx = mlx_setup.prepare(self._settings)
        mx.clear_cache()
        folder = mlx_setup.model_folder(name, "embedding")
        mlx_setup.check_fits(mx, folder, name, self._settings)
        from minions.agents.macos.runners import mlx_bert

        try:
            model, config = mlx_bert.load(folder)
            import transformers

            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
        except (mlx_bert.Unsupported, OSError, ValueError) as exc:
            log.warning("mlx_cannot_load", model=name, reason=str(exc))
            raise CannotLoad(f"MLX cannot load embedding model {name!r}: {exc}") from exc
        self._identities.loaded(name, model)
        loaded = _Loaded(name, tokenizer, model, mx.float32, {}, 32)
        loaded.dtype, loaded.report = self._choose(mx, loaded, mlx_setup.quantization(config), reference, stop)
        loaded.batch_size = self._batch_size(mx, loaded, stop)
        self._reports[name] = loaded.report
        self._loaded = loaded
        return loaded

    def unload(self) -> None:
        """Drop the loaded model (backend_choice.py, when torch serves it instead). Blocking."""
        if self._loaded is not None:
            self._loaded = None
            import mlx.core as mx

            mx.clear_cache()

    def _batch_size(self, mx: Any, loaded: _Loaded, stop: threading.Event | None) -> int:
        """Probed on the Apple GPU (batch_sizing.py); fixed on MLX's CPU build, which runs for parity
        only (its reference BLAS is far slower than torch on the same CPU)."""
        if mlx_setup.device_name(mx) == "cpu":
            return CPU_BATCH_SIZE
        probe = EmbeddingParams()
        return batch_sizing.choose(
            None, "mlx-gpu", lambda texts: self._embed(loaded.tokenizer, loaded.model, loaded.dtype, texts, probe),
            self._settings.memory_fraction, lambda: check_stop(stop)).batch_size

    def _choose(self, mx: Any, loaded: _Loaded, quantized: str | None, reference: Reference | None,
                stop: threading.Event | None) -> tuple[Any, dict[str, Any]]:
        """The compute dtype and the report of its choice: the setting's precision, or under auto the
        fastest the device runs natively within the gate (fp16 on the Apple GPU) of the reference. A
        quantized model runs as converted; its cosine is known only against a reference."""
        probe = EmbeddingParams()
        texts = list(precision.PROBE_TEXTS)
        device = mlx_setup.device_name(mx)
        dtypes = {"fp32": mx.float32, "bf16": mx.bfloat16, "fp16": mx.float16}

        def embed(name: str) -> Any:
            if quantized is None:
                loaded.model.set_dtype(dtypes[name])
            try:
                return self._embed(loaded.tokenizer, loaded.model, dtypes[name], texts, probe)
            finally:
                if quantized is None:
                    loaded.model.set_dtype(mx.float32)

        setting = self._settings.precision
        if quantized is not None:
            stored = loaded.model.embeddings.LayerNorm.weight.dtype
            tried = [next((n for n, d in dtypes.items() if d == stored), "fp32")]
        elif setting != "auto":
            tried = [setting]
        else:
            tried = ["fp32", "fp16"] if device == "gpu" else ["fp32"]
        ref = reference(texts) if reference is not None else None if quantized is not None else embed("fp32")
        measured: dict[str, dict[str, float]] = {}
        for name in tried:
            check_stop(stop)
            vectors = embed(name)
            measured[name] = {"cosine": _min_cosine(vectors, ref) if ref is not None else float("nan")}
        best = tried[0]
        if len(tried) > 1:
            timings = precision.time_alternating({name: functools.partial(embed, name) for name in tried},
                                                 lambda: check_stop(stop))
            for name, figures in precision.summarize(timings).items():
                measured[name].update(figures)
            best = precision.select(measured, self._settings.min_cosine)
        if best != "fp32" and quantized is None:
            loaded.model.set_dtype(dtypes[best])
        cosine = measured[best]["cosine"]
        report: dict[str, Any] = {
            "model": loaded.name, "device": f"mlx-{device}", "precision": best,
            "cosine": None if cosine != cosine else round(cosine, 7), "setting": setting, "backend": BACKEND,
        }
        if quantized is not None:
            report["quantization"] = quantized
        log.info("precision_chosen", model=loaded.name, device=report["device"], backend=BACKEND, precision=best,
                 quantization=quantized, cosine=report["cosine"],
                 against="transformers fp32" if reference else "mlx fp32")
        return dtypes[best], report


def _min_cosine(vectors: Any, reference: Any) -> float:
    import numpy as np

    a = np.asarray(vectors, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b = b / np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    return float((a * b).sum(axis=1).min())

