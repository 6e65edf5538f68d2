"""The `completion` kind on transformers' `generate`, on the agent's own device.

The records of a subtask are generated in batches: sorted by prompt length (so a batch carries
little padding), left-padded (so every row's next token sits at the same position), at most
`generation_batch_size` at a time (DEFAULT_BATCH_SIZE per device unless set). Under greedy decoding
(temperature 0) each record's output is the one it gets generated alone. Sampling with a `seed` is
reproducible for the same subtask on the same agent settings (records, their order, batch size,
device and precision): the seed is set before each batch, and a batch draws its rows' tokens from
one random stream, so a record's text also depends on which records share its batch; it is not
the text the same seed gives that record alone, nor what Ollama gives. Stopping (owner back, lease
lost) is checked between decoding steps, so it never waits for a batch to finish.

Every result carries a proof of its generation (completion_proof.py): the generated token ids and,
every 32 tokens, the largest coordinates of the hidden state that produced one. A lease that checks
another executor's results (`check`: a spot check's replica) verifies their proofs with one prefill
pass per record instead of generating: a record whose proof holds is answered with that result as it
is (so the two agree), any other is generated here (so they do not).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
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
from minions.agents.macos.runners.completion_proof import PROOF_VERSION, StepTops, check_proof
from minions.agents.macos.runners.model_identity import ModelIdentities
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.logging import get_logger

# Records generated together per device when the agent sets no generation_batch_size. Decoding is
# bound by reading the weights once per step, so rows are nearly free until compute saturates;
# these stay modest because the KV cache grows with rows x tokens on the owner's machine.
DEFAULT_BATCH_SIZE = {"cpu": 16, "mps": 32, "cuda": 64}
log = get_logger(__name__)


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

    def __init__(self, settings: TorchSettings, thread: InferenceThread | None = None) -> None:
        self._settings = settings
        self._thread = thread or InferenceThread("completion")  # shared when backend_choice.py compares engines
        self._loaded: _LoadedLM | None = None
        self._identities = ModelIdentities("transformers")

    async def fingerprints(self, models: Sequence[str]) -> list[dict[str, Any]]:
        """What each of `models` found here is (model_identity.py), and the precision it runs in."""
        chosen = self._settings.precision
        if chosen == "auto":
            chosen = "fp16" if torch_setup.half_precision(self._settings.device) else "fp32"
        reports = await self._thread.call(lambda stop: self._identities.reports(models, lambda model: chosen))
        return [{**report, "proofs": PROOF_VERSION} for report in reports]

    async def advertised_models(self) -> list[str]:
        return []  # only the models named in the agent's configuration

    async def aclose(self) -> None:
        self._thread.shutdown()

    def unload(self) -> None:
        """Drop the loaded model (backend_choice.py, when MLX serves it instead). Blocking."""
        if self._loaded is not None:
            self._loaded = None
            torch_setup.free_memory(self._settings.device)

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        model = require_model(subtask)
        params = CompletionParams.parse(subtask.params)
        for record in records:
            record_messages(record, params.system)  # reject bad records before loading anything
        if subtask.check is not None:
            held = [_lines(output) for output in subtask.check.outputs]
            return await self._thread.call(lambda stop: self.verify(model, records, params, held, stop))
        return await self._thread.call(lambda stop: self.generate(model, records, params, stop))

    def batch_size(self) -> int:
        return self._settings.generation_batch_size or DEFAULT_BATCH_SIZE.get(self._settings.device, 8)

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
        prompts = [self._prompt_ids(loaded.tokenizer, record, params) for record in records]
        # Longest first: similar lengths share a batch, and the largest KV cache comes first, so
        # running out of memory shows at once.
        order = sorted(range(len(records)), key=lambda i: len(prompts[i]), reverse=True)
        outputs: list[Record] = [{} for _ in records]
        size = self.batch_size()
        with torch.inference_mode():
            for start in range(0, len(order), size):
                check_stop(stop)
                batch = order[start : start + size]
                generated, tops = self._batch(torch, loaded, [prompts[i] for i in batch], params, criteria)
                check_stop(stop)  # a stopped batch's outputs are cut short: never hand them in
                for row, (i, tokens) in enumerate(zip(batch, generated, strict=True)):
                    text = loaded.tokenizer.decode(tokens, skip_special_tokens=True)
                    outputs[i] = output_record(records[i], text, len(prompts[i]), len(tokens))
                    if tops.steps:  # none for a model without an LM head module to hook
                        outputs[i]["proof"] = tops.proof(row, tokens)
        return outputs

    def verify(
        self,
        model_name: str,
        records: list[Record],
        params: CompletionParams,
        held: list[list[Record]],
        stop: threading.Event | None = None,
    ) -> list[Record]:
        """Blocking: each record's first held result (in round order) whose proof holds, as it is; the
        others generated here."""
        torch = torch_setup.prepare(self._settings)
        loaded = self._load(model_name)
        temperature = DEFAULT_TEMPERATURE if params.temperature is None else float(params.temperature)

        def decode(tokens: list[int]) -> str:
            return str(loaded.tokenizer.decode(tokens, skip_special_tokens=True))

        outputs: list[Record | None] = [None] * len(records)
        with torch.inference_mode():
            for i, record in enumerate(records):
                check_stop(stop)
                prompt = self._prompt_ids(loaded.tokenizer, record, params)
                for round_, lines in enumerate(held, start=1):
                    line = lines[i] if i < len(lines) else None
                    if line is None or line.get("id") != record.get("id") or "error" in line:
                        continue
                    why = check_proof(torch, loaded.model, prompt, line, decode, temperature,
                                      params.max_tokens or DEFAULT_MAX_TOKENS, _eos_ids(loaded.model))
                    if why is None:
                        outputs[i] = line
                        break
                    log.info("proof_refused", record=str(record.get("id")), round=round_, why=why)
        missing = [i for i, out in enumerate(outputs) if out is None]
        if missing:
            for i, out in zip(missing, self.generate(model_name, [records[i] for i in missing], params, stop),
                              strict=True):
                outputs[i] = out
        return [out for out in outputs if out is not None]

    def _prompt_ids(self, tokenizer: Any, record: Record, params: CompletionParams) -> list[int]:
        text, special = build_prompt(tokenizer, record, params.system)
        return list(tokenizer(text, add_special_tokens=special)["input_ids"])

    def _batch(
        self, torch: Any, loaded: _LoadedLM, prompts: list[list[int]], params: CompletionParams, criteria: Any
    ) -> tuple[list[list[int]], StepTops]:
        """The new tokens of each prompt (up to its first end of sequence), generated together, and
        what their proofs are made of."""
        model = loaded.model
        pad = _pad_id(loaded.tokenizer, model)
        width = max(len(p) for p in prompts)
        # Left padding, masked out: generation appends at the right, the same column for all rows.
        input_ids = torch.tensor([[pad or 0] * (width - len(p)) + p for p in prompts], device=self._settings.device)
        attention_mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self._settings.device
        )
        temperature = DEFAULT_TEMPERATURE if params.temperature is None else float(params.temperature)
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sampling = {"do_sample": True, "temperature": temperature}
        if params.seed is not None:
            torch.manual_seed(params.seed)  # same seed, same batch, same text: see the module docstring
        with StepTops(torch, model) as tops:
            generated = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
                pad_token_id=pad,
                stopping_criteria=criteria,
                **sampling,
            )
        eos = model.generation_config.eos_token_id
        return [_until_eos(row[width:], eos) for row in generated.tolist()], tops

    def _load(self, name: str) -> _LoadedLM:
        if self._loaded is not None and self._loaded.name == name:
            return self._loaded
        if self._loaded is not None:
            self._loaded = None
            torch_setup.free_memory(self._settings.device)
        tokenizer, model = torch_setup.load_pretrained(
            name, "AutoModelForCausalLM", "completion", self._settings.device, self._settings.precision
        )
        self._identities.loaded(name, model)
        self._loaded = _LoadedLM(name, tokenizer, model)
        return self._loaded


def _pad_id(tokenizer: Any, model: Any) -> int | None:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    eos = model.generation_config.eos_token_id
    return int(eos[0] if isinstance(eos, list) else eos) if eos is not None else None


def _eos_ids(model: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


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


def _lines(output: str) -> list[Record]:
    """A held result's lines (JSONL); a line that is not an object counts as none."""
    import orjson

    lines: list[Record] = []
    for line in output.splitlines():
        if line.strip():
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                value = None
            lines.append(value if isinstance(value, dict) else {})
    return lines
