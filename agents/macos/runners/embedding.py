"""The `embedding` kind: transformers encoder, mean (or CLS) pooling, L2 normalisation.

Matches sentence-transformers' `encode(normalize_embeddings=True)` for mean-pooling models, and is
faster than a plain loop because texts are sorted by length (batches carry little padding), the
model runs in the fastest precision that keeps its vectors (precision.py) and batches are as large
as still pays on this device (batch_sizing.py); both are chosen once, when the model loads. Texts
become the model's input arrays off the device's critical path (token_batches.py): the Rust
tokenizer straight into numpy arrays, the next batch encoded while the device runs the current one.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners import batch_sizing, model_paths, precision, torch_setup
from minions.agents.macos.runners.base import (
    InferenceThread,
    Record,
    check_stop,
    checked_params,
    require_model,
    string_field,
)
from minions.agents.macos.runners.model_identity import ModelIdentities
from minions.agents.macos.runners.token_batches import TokenBatcher, TokenPipeline, to_device
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.kinds import PARAMS
from minions.logging import get_logger

log = get_logger(__name__)
_PARAMS = PARAMS["embedding"]


@dataclass(frozen=True)
class EmbeddingParams:
    normalize: bool = _PARAMS["normalize"].default
    pooling: str = _PARAMS["pooling"].default
    max_length: int = _PARAMS["max_length"].default
    batch_size: int | None = None  # None: the size chosen for this device at model load

    @classmethod
    def parse(cls, params: dict[str, Any]) -> EmbeddingParams:
        return cls(**checked_params("embedding", params))


@dataclass
class _Loaded:
    name: str
    tokens: TokenBatcher  # texts to the input arrays the model's forward accepts
    precise: precision.Precise  # the model in the precision chosen for it
    inputs: frozenset[str]  # the tokenizer outputs the model's forward accepts
    choice: precision.Choice
    batch_size: int
    pipeline: TokenPipeline  # the next batch tokenized while the device runs this one


class EmbeddingRunner:
    kind = "embedding"

    def __init__(self, settings: TorchSettings, thread: InferenceThread | None = None) -> None:
        self._settings = settings
        self._thread = thread or InferenceThread("embedding")  # shared when backend_choice.py compares engines
        # One model stays loaded across subtasks; a subtask of another model replaces it (owners'
        # memory matters more than the load time of a second model).
        self._loaded: _Loaded | None = None
        self._choices: dict[str, precision.Choice] = {}  # per model, kept after it is unloaded
        self._batch_sizes: dict[str, int] = {}  # per model: the batch size chosen at its load
        self._identities = ModelIdentities("transformers")

    def precision_choices(self) -> list[precision.Choice]:
        """The precision chosen for each model loaded so far (reported at registration)."""
        return list(self._choices.values())

    def precision_reports(self) -> list[dict[str, Any]]:
        return [{**choice.to_json(), "backend": "torch",
                 **({"batch_size": self._batch_sizes[m]} if m in self._batch_sizes else {})}
                for m, choice in self._choices.items()]

    def unload(self) -> None:
        """Drop the loaded model (backend_choice.py, when MLX serves it instead). Blocking."""
        self._drop_loaded()

    def _drop_loaded(self) -> None:
        if self._loaded is not None:
            self._loaded.pipeline.shutdown()
            self._loaded = None
            torch_setup.free_memory(self._settings.device)

    async def fingerprints(self, models: Sequence[str]) -> list[dict[str, Any]]:
        """What each of `models` found here is (model_identity.py), with the precision it runs in: the
        one chosen at load, or the one forced by --precision; None while `auto` has not chosen yet.
        On the worker thread: a folder's first hash reads its files."""

        def chosen(model: str) -> str | None:
            choice = self._choices.get(model)
            if choice is not None:
                return choice.precision
            return None if self._settings.precision == "auto" else self._settings.precision

        return await self._thread.call(lambda stop: self._identities.reports(models, chosen))

    async def prepare(self, model_name: str) -> precision.Choice:
        """Load `model_name` now (choosing its precision and batch size), not at the first subtask."""
        return await self._thread.call(lambda stop: self._load(model_name, stop).choice)

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        model = require_model(subtask)
        params = EmbeddingParams.parse(subtask.params)
        texts = [string_field(r, "text") for r in records]
        vectors, tokens = await self._thread.call(lambda stop: self.encode_counted(model, texts, params, stop))
        # float32 rows, not lists of doubles: the output then holds each value as the shortest
        # text that round-trips float32 (jsoncodec.dumps_line), about half the bytes.
        return [{"id": r["id"], "embedding": v, "usage": {"prompt_tokens": n}}
                for r, v, n in zip(records, vectors, tokens, strict=True)]

    async def advertised_models(self) -> list[str]:
        return [model_paths.MINILM] if model_paths.bundled_minilm_available() else []

    async def aclose(self) -> None:
        if self._loaded is not None:
            self._loaded.pipeline.shutdown()
        self._thread.shutdown()

    def encode(
        self, model_name: str, texts: list[str], params: EmbeddingParams, stop: threading.Event | None = None
    ) -> list[list[float]]:
        """Vectors for `texts`, in their order. Blocking: call it on the worker thread."""
        vectors, _ = self.encode_counted(model_name, texts, params, stop)
        return [row.tolist() for row in vectors]

    def encode_counted(
        self, model_name: str, texts: list[str], params: EmbeddingParams, stop: threading.Event | None = None
    ) -> tuple[Any, list[int]]:
        """Vectors for `texts` (a float32 numpy array, one row per text, in their order) and the tokens
        each was embedded from (read off the attention mask: the texts are tokenized once).
        Blocking: call it on the worker thread."""
        import numpy as np  # with torch: only agents that embed pay for it

        torch = torch_setup.prepare(self._settings)
        loaded = self._load(model_name, stop)
        batch_size = params.batch_size or loaded.batch_size
        # Longest first: batches of similar length waste little on padding, and the biggest
        # batch comes first, so running out of memory shows at once.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        vectors: Any = None
        tokens = [0] * len(texts)
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        groups = [[texts[i] for i in batch] for batch in batches]
        with torch.inference_mode():
            for batch, arrays in zip(batches, loaded.pipeline.batches(groups, params.max_length), strict=True):
                check_stop(stop)
                pooled = self._embed_arrays(torch, loaded.precise, loaded.inputs, arrays, params)
                if vectors is None:
                    vectors = np.empty((len(texts), pooled.shape[1]), dtype=np.float32)
                vectors[batch] = pooled.numpy()
                for i, n in zip(batch, arrays["attention_mask"].sum(axis=1).tolist(), strict=True):
                    tokens[i] = n
        return (vectors if vectors is not None else np.empty((0, 0), dtype=np.float32)), tokens

    def _embed_with(
        self,
        torch: Any,
        tokens: TokenBatcher,
        precise: precision.Precise,
        accepted: frozenset[str],
        texts: list[str],
        params: EmbeddingParams,
    ) -> Any:
        """Normalised (or not) pooled vectors of `texts`, fp32 on the CPU (the probes' path)."""
        return self._embed_arrays(torch, precise, accepted, tokens.encode(texts, params.max_length), params)

    def _embed_arrays(self, torch: Any, precise: precision.Precise, accepted: frozenset[str],
                      arrays: dict[str, Any], params: EmbeddingParams) -> Any:
        """Normalised (or not) pooled vectors of one batch's input arrays, fp32 on the CPU."""
        inputs = to_device(torch, arrays, self._settings.device)
        with precise.context():
            output = precise.model(**{k: v for k, v in inputs.items() if k in accepted})[0]
        hidden = output.float()  # pool in fp32 whatever precision the model runs in
        if params.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            # The masked sum as one batched matrix product (mask row x hidden): the product of the
            # (batch, tokens, dims) tensor with the mask was a second tensor of that size, 20 us a
            # sentence on a CPU (bench/agent_overhead.py), for what is a weighted sum.
            mask = inputs["attention_mask"].to(hidden.dtype)
            pooled = torch.bmm(mask.unsqueeze(1), hidden).squeeze(1) / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)
        if params.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.cpu()

    def _load(self, name: str, stop: threading.Event | None = None) -> _Loaded:
        if self._loaded is not None and self._loaded.name == name:
            return self._loaded
        self._drop_loaded()
        torch = torch_setup.prepare(self._settings)
        settings = self._settings
        # fp32 first: the reference every faster precision is measured against.
        tokenizer, model = torch_setup.load_pretrained(name, "AutoModel", "embedding", settings.device, "fp32")
        self._identities.loaded(name, model)  # what it loaded, before serving anything from it
        accepted = frozenset(inspect.signature(model.forward).parameters)
        tokens = TokenBatcher(tokenizer, accepted)
        probe = EmbeddingParams()

        def embed(precise: precision.Precise, texts: list[str]) -> Any:
            with torch.inference_mode():
                return self._embed_with(torch, tokens, precise, accepted, texts, probe)

        def stopped() -> None:
            check_stop(stop)

        # The batch size first, in fp32 (the most memory a batch takes: a size that fits it fits every
        # faster variant), then the precision timed at that size: an H200 chose fp32 from a probe of a
        # dozen texts ("fp16 1.016x") where, at batch 512, half precision is 1.2x fp32. A faster
        # precision chosen, the batch size is chosen again in it.
        fp32 = precision.apply(torch, model, settings.device, precision.FP32)
        sizing = batch_sizing.choose(
            torch, settings.device, functools.partial(embed, fp32), settings.mps_memory_fraction, stopped
        )
        precise, choice = precision.choose(
            torch, name, model, settings.device, embed, settings.precision, settings.min_cosine, stopped,
            timing_texts=[batch_sizing.TYPICAL_TEXT] * batch_sizing.timing_size(sizing),
        )
        # One copy of the weights from here on: a chosen cast variant is a copy, and the fp32 model
        # (the probe's reference) goes with this name; autocast and fp32 keep using it.
        del model, fp32
        torch_setup.free_memory(settings.device)
        if choice.precision != "fp32":
            # Sized again in the precision it runs: a CPU's fp32 stops growing at 8 where bf16 runs
            # fastest at 32-64 (the fp32 size cost bf16 a quarter of its speed).
            sizing = batch_sizing.choose(
                torch, settings.device, functools.partial(embed, precise), settings.mps_memory_fraction, stopped
            )
        self._choices[name] = choice
        self._batch_sizes[name] = sizing.batch_size
        self._loaded = _Loaded(name, tokens, precise, accepted, choice, sizing.batch_size, TokenPipeline(tokens))
        return self._loaded
