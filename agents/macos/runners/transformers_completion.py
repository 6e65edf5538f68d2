"""The `completion` kind on transformers' `generate`, on the agent's own device."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners import torch_setup
from minions.agents.macos.runners.base import InferenceThread, Record, check_stop, require_model
from minions.agents.macos.runners.completion import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    CompletionParams,
    output_record,
    record_messages,
)
from minions.agents.macos.runners.torch_setup import TorchSettings


def build_prompt(tokenizer: Any, record: Record, system: str | None) -> tuple[str, bool]:
    """The text to generate from, and whether the tokenizer should add its special tokens.

    With a chat template, prompts and messages both go through it (as Ollama does). Without one,
    a prompt is used as is and messages are joined as `role: content` lines.
    """
    messages = record_messages(record, system)
    if getattr(tokenizer, "chat_template", None):
        if messages is None:
            messages = record_messages({"messages": [{"role": "user", "content": record["prompt"]}]}, system)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return str(text), False  # the template writes its own special tokens
    if messages is None:
        prompt = str(record["prompt"])
        return (f"{system}\n\n{prompt}" if system else prompt), True
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"]), True


@dataclass
class _LoadedLM:
    name: str
    tokenizer: Any
    model: Any


class TransformersCompletionRunner:
    kind = "completion"

    def __init__(self, settings: TorchSettings) -> None:
        self._settings = settings
        self._thread = InferenceThread("completion")
        self._loaded: _LoadedLM | None = None

    async def advertised_models(self) -> list[str]:
        return []  # only the models named in the agent's configuration

    async def aclose(self) -> None:
        self._thread.shutdown()

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        model = require_model(subtask)
        params = CompletionParams.parse(subtask.params)
        for record in records:
            record_messages(record, params.system)  # reject bad records before loading anything
        return await self._thread.call(lambda stop: self.generate(model, records, params, stop))

    def generate(
        self,
        model_name: str,
        records: list[Record],
        params: CompletionParams,
        stop: threading.Event | None = None,
    ) -> list[Record]:
        """Blocking: call it on the worker thread."""
        torch = torch_setup.prepare(self._settings)
        loaded = self._load(model_name)
        criteria = _stop_criteria(stop)
        outputs = []
        with torch.inference_mode():
            for record in records:
                check_stop(stop)
                outputs.append(self._one(torch, loaded, record, params, criteria))
        check_stop(stop)
        return outputs

    def _one(self, torch: Any, loaded: _LoadedLM, record: Record, params: CompletionParams, criteria: Any) -> Record:
        tokenizer, model = loaded.tokenizer, loaded.model
        text, special = build_prompt(tokenizer, record, params.system)
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=special).to(self._settings.device)
        temperature = DEFAULT_TEMPERATURE if params.temperature is None else float(params.temperature)
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sampling = {"do_sample": True, "temperature": temperature}
        if params.seed is not None:
            torch.manual_seed(params.seed)  # same seed, same text: as Ollama's `seed` option
        generated = model.generate(
            **encoded,
            max_new_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
            pad_token_id=_pad_id(tokenizer, model),
            stopping_criteria=criteria,
            **sampling,
        )
        prompt_len = encoded["input_ids"].shape[1]
        new_tokens = generated[0, prompt_len:].tolist()
        new_tokens = _until_eos(new_tokens, model.generation_config.eos_token_id)
        text = tokenizer.decode(new_tokens, skip_special_tokens=True)
        return output_record(record, text, prompt_len, len(new_tokens))

    def _load(self, name: str) -> _LoadedLM:
        if self._loaded is not None and self._loaded.name == name:
            return self._loaded
        if self._loaded is not None:
            self._loaded = None
            torch_setup.free_memory(self._settings.device)
        tokenizer, model = torch_setup.load_pretrained(name, "AutoModelForCausalLM", "completion",
                                                       self._settings.device)
        self._loaded = _LoadedLM(name, tokenizer, model)
        return self._loaded


def _pad_id(tokenizer: Any, model: Any) -> int | None:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    eos = model.generation_config.eos_token_id
    return int(eos[0] if isinstance(eos, list) else eos) if eos is not None else None


def _until_eos(tokens: list[int], eos: int | list[int] | None) -> list[int]:
    """The generated tokens up to and including the first end-of-sequence (the rest is padding)."""
    stops = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[: i + 1]
    return tokens


def _stop_criteria(stop: threading.Event | None) -> Any:
    """A StoppingCriteria that ends `generate` early once the agent sets `stop`."""
    if stop is None:
        return None
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    event = stop

    class StopWhenAsked(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), event.is_set(), dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([StopWhenAsked()])
