"""The `completion` kind on MLX, through mlx-lm: `mlx_lm.load` (a Hugging Face folder in safetensors,
or an mlx-community conversion, quantized or not) and mlx-lm's continuous batching (`BatchGenerator`,
what its `batch_generate` runs) for every record of a subtask at once.

Prompts are built exactly as the transformers backend builds them (its chat template, or the prompt
as is), and greedy decoding (temperature 0, the default) picks the same tokens as transformers'
`generate` on the same weights (tests/agent/test_mlx.py); each output counts its end-of-sequence
token as that backend does. The generator is driven one step at a time, so a stop (lease lost, owner
back) ends it between two tokens. No generation proofs: a spot check's replica generates its own.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners import mlx_setup
from minions.agents.macos.runners.base import InferenceThread, Record, RunnerError, check_stop, require_model
from minions.agents.macos.runners.completion import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    CompletionParams,
    output_record,
    record_messages,
)
from minions.agents.macos.runners.mlx_setup import MLXSettings
from minions.agents.macos.runners.model_identity import ModelIdentities
from minions.agents.macos.runners.transformers_completion import build_prompt
from minions.logging import get_logger

log = get_logger(__name__)
BACKEND = "mlx"
DEFAULT_BATCH_SIZE = {"cpu": 16, "gpu": 32}  # records decoded together, as transformers_completion.py


class CannotLoad(RunnerError):
    """mlx-lm cannot run this model (an architecture it lacks, weights it cannot read)."""


@dataclass
class _Loaded:
    name: str
    model: Any
    tokenizer: Any  # mlx-lm's TokenizerWrapper (the Hugging Face tokenizer's attributes pass through)
    precision: str


class MLXCompletionRunner:
    kind = "completion"
    backend = BACKEND

    def __init__(self, settings: MLXSettings, thread: InferenceThread | None = None) -> None:
        self._settings = settings
        self._thread = thread or InferenceThread("mlx-completion")
        self._loaded: _Loaded | None = None
        self._precisions: dict[str, str] = {}
        self._identities = ModelIdentities(BACKEND)

    async def fingerprints(self, models: Sequence[str]) -> list[dict[str, Any]]:
        return await self._thread.call(lambda stop: self._identities.reports(models, self._precisions.get))

    async def advertised_models(self) -> list[str]:
        return []  # only the models named in the agent's configuration

    async def aclose(self) -> None:
        self._thread.shutdown()

    def unload(self) -> None:
        """Drop the loaded model (backend_choice.py, when torch serves it instead). Blocking."""
        if self._loaded is not None:
            self._loaded = None
            import mlx.core as mx

            mx.clear_cache()

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        model = require_model(subtask)
        params = CompletionParams.parse(subtask.params)
        for record in records:
            record_messages(record, params.system)  # reject bad records before loading anything
        return await self._thread.call(lambda stop: self.generate(model, records, params, stop))

    def batch_size(self) -> int:
        import mlx.core as mx

        return self._settings.generation_batch_size or DEFAULT_BATCH_SIZE[mlx_setup.device_name(mx)]

    def prompt_ids(self, model_name: str, record: Record, params: CompletionParams) -> list[int]:
        tokenizer = self.load(model_name).tokenizer
        text, special = build_prompt(tokenizer, record, params.system)
        return list(tokenizer._tokenizer(text, add_special_tokens=special)["input_ids"])

    def generate(self, model_name: str, records: list[Record], params: CompletionParams,
                 stop: threading.Event | None = None) -> list[Record]:
        """Blocking: every record generated together (continuous batching), in input order."""
        loaded = self.load(model_name)
        prompts = [self.prompt_ids(model_name, record, params) for record in records]
        tokens = self.generate_ids(loaded, prompts, params, stop)
        return [output_record(record, loaded.tokenizer.decode(ids, skip_special_tokens=True), len(prompt), len(ids))
                for record, prompt, ids in zip(records, prompts, tokens, strict=True)]

    def generate_ids(self, loaded: _Loaded, prompts: list[list[int]], params: CompletionParams,
                     stop: threading.Event | None = None) -> list[list[int]]:
        """The new tokens of each prompt, up to and including its end of sequence."""
        import mlx.core as mx

        mlx_setup.import_mlx_lm()  # first, by the helper that keeps the open-file limit
        from mlx_lm.generate import BatchGenerator
        from mlx_lm.sample_utils import make_sampler

        temperature = DEFAULT_TEMPERATURE if params.temperature is None else float(params.temperature)
        if params.seed is not None:
            mx.random.seed(params.seed)
        eos = sorted(loaded.tokenizer.eos_token_ids)
        generator = BatchGenerator(
            loaded.model,
            stop_tokens=[[t] for t in eos],
            sampler=make_sampler(temp=temperature) if temperature > 0 else None,  # None: greedy
            completion_batch_size=self.batch_size(),
            prefill_batch_size=min(self.batch_size(), 8),
        )
        try:
            uids = generator.insert(prompts, [params.max_tokens or DEFAULT_MAX_TOKENS] * len(prompts))
            out: dict[int, list[int]] = {uid: [] for uid in uids}
            while responses := generator.next_generated():
                check_stop(stop)
                for response in responses:
                    out[response.uid].append(int(response.token))  # the end of sequence too, as transformers
        finally:
            generator.close()
        return [out[uid] for uid in uids]

    def load(self, name: str) -> _Loaded:
        """Load `name` once (another model replaces it). Raises CannotLoad when mlx-lm cannot run it,
        RunnerError when its weights do not fit under the memory cap."""
        if self._loaded is not None and self._loaded.name == name:
            return self._loaded
        self._loaded = None
        mx = mlx_setup.prepare(self._settings)
        mx.clear_cache()
        folder = mlx_setup.model_folder(name, "completion")
        mlx_setup.check_fits(mx, folder, name, self._settings)
        mlx_lm = mlx_setup.import_mlx_lm()
        try:
            model, tokenizer = mlx_lm.load(str(folder))[:2]
        except (ValueError, OSError, KeyError, FileNotFoundError) as exc:
            log.warning("mlx_cannot_load", model=name, reason=str(exc))
            raise CannotLoad(f"mlx-lm cannot load completion model {name!r}: {exc}") from exc
        self._identities.loaded(name, model)
        import json

        config = json.loads((folder / "config.json").read_text())
        quantized = mlx_setup.quantization(config)
        precision = quantized or _dtype_name(model)
        log.info("mlx_completion_model_loaded", model=name, precision=precision,
                 device=f"mlx-{mlx_setup.device_name(mx)}")
        self._precisions[name] = precision
        self._loaded = _Loaded(name, model, tokenizer, precision)
        return self._loaded


def _dtype_name(model: Any) -> str:
    from mlx.utils import tree_flatten

    names = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
    for _, value in tree_flatten(model.parameters()):
        dtype = str(value.dtype).removeprefix("mlx.core.")
        if dtype in names:
            return names[dtype]
    return "fp32"
