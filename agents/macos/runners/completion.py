"""The `completion` kind, with two backends: a local Ollama server (the default, as in the paper)
or transformers' `generate` on the agent's own device.

Both take records `{"id", "prompt"}` or `{"id", "messages": [{"role", "content"}]}` and params
`temperature`, `max_tokens`, `seed`, `system`, and both answer
`{"id", "text", "usage": {"prompt_tokens", "completion_tokens"}}`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import ollama

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners import torch_setup
from minions.agents.macos.runners.base import (
    InferenceThread,
    PermanentError,
    Record,
    RunnerError,
    check_stop,
    require_model,
    string_field,
)
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.logging import get_logger

log = get_logger(__name__)

# Ollama's own default, so that both backends sample alike when a task sets no temperature.
DEFAULT_TEMPERATURE = 0.8
# Ollama's default is "until the context is full"; a bound keeps a runaway model from holding a
# lease for ever on the transformers backend.
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class CompletionParams:
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    system: str | None = None

    @classmethod
    def parse(cls, params: dict[str, Any]) -> CompletionParams:
        p = cls(
            temperature=params.get("temperature"),
            max_tokens=params.get("max_tokens"),
            seed=params.get("seed"),
            system=params.get("system"),
        )
        if p.temperature is not None and (
            isinstance(p.temperature, bool) or not isinstance(p.temperature, int | float) or p.temperature < 0
        ):
            raise PermanentError("params.temperature must be a number >= 0")
        for name in ("max_tokens", "seed"):
            value = getattr(p, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise PermanentError(f"params.{name} must be an integer")
        if p.max_tokens is not None and p.max_tokens < 1:
            raise PermanentError("params.max_tokens must be >= 1")
        if p.system is not None and not isinstance(p.system, str):
            raise PermanentError("params.system must be a string")
        return p


def record_messages(record: Record, system: str | None) -> list[dict[str, str]] | None:
    """The chat messages of a `messages` record (with `system` first unless it has its own), or
    None for a `prompt` record."""
    if "messages" not in record:
        string_field(record, "prompt")
        return None
    raw = record["messages"]
    if not isinstance(raw, list) or not raw:
        raise PermanentError(f"record {record.get('id')!r}: messages must be a non-empty list")
    messages = []
    for message in raw:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PermanentError(f"record {record.get('id')!r}: each message needs a role and content")
        messages.append({"role": message["role"], "content": string_field(message, "content")})
    if system is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _output(record: Record, text: str, prompt_tokens: int, completion_tokens: int) -> Record:
    return {
        "id": record["id"],
        "text": text,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


# -- Ollama ------------------------------------------------------------------------------------


class OllamaCompletionRunner:
    kind = "completion"

    def __init__(self, host: str, allow_pull: bool = False, client: ollama.AsyncClient | None = None) -> None:
        self._host = host
        self._allow_pull = allow_pull
        self._client = client or ollama.AsyncClient(host=host)
        self._pulled: set[str] = set()

    async def advertised_models(self) -> list[str]:
        """The models Ollama already holds (`ollama list`); none when it is not running."""
        try:
            listing = await self._client.list()
        except (ConnectionError, ollama.ResponseError) as exc:
            log.warning("ollama_unreachable", host=self._host, error=str(exc))
            return []
        names = [m.model for m in listing.models if m.model]
        # Tasks often say "llama3.2" for what Ollama lists as "llama3.2:latest": advertise both.
        bare = [n.removesuffix(":latest") for n in names if n.endswith(":latest")]
        return list(dict.fromkeys([*names, *bare]))

    async def run(self, subtask: Subtask, records: list[Record]) -> list[Record]:
        model = require_model(subtask)
        params = CompletionParams.parse(subtask.params)
        options = {
            k: v
            for k, v in {
                "temperature": params.temperature,
                "num_predict": params.max_tokens,
                "seed": params.seed,
            }.items()
            if v is not None
        }
        prepared = [(record, record_messages(record, params.system)) for record in records]
        # One record at a time: Ollama queues parallel requests per model anyway, and sequential
        # calls keep cancellation (owner back, lease lost) immediate.
        return [await self._one(model, record, messages, params, options) for record, messages in prepared]

    async def _one(
        self,
        model: str,
        record: Record,
        messages: list[dict[str, str]] | None,
        params: CompletionParams,
        options: dict[str, Any],
    ) -> Record:
        try:
            return await self._request(model, record, messages, params, options)
        except ollama.ResponseError as exc:
            if exc.status_code != 404 or "not found" not in exc.error:
                raise _ollama_error(model, exc) from exc
            if not self._allow_pull or model in self._pulled:
                raise PermanentError(
                    f"model {model!r} is not in the local Ollama ({self._host}); run `ollama pull {model}` "
                    "or start the agent with --allow-pull"
                ) from exc
        await self._pull(model)
        try:
            return await self._request(model, record, messages, params, options)
        except ollama.ResponseError as exc:
            raise _ollama_error(model, exc) from exc

    async def _request(
        self,
        model: str,
        record: Record,
        messages: list[dict[str, str]] | None,
        params: CompletionParams,
        options: dict[str, Any],
    ) -> Record:
        try:
            if messages is not None:
                chat = await self._client.chat(model=model, messages=messages, options=options, stream=False)
                text = chat.message.content or ""
                prompt_tokens, completion_tokens = chat.prompt_eval_count, chat.eval_count
            else:
                # system "" is Ollama's "no system prompt": the model's own default applies.
                gen = await self._client.generate(
                    model=model,
                    prompt=record["prompt"],
                    system=params.system or "",
                    options=options,
                    stream=False,
                )
                text = gen.response or ""
                prompt_tokens, completion_tokens = gen.prompt_eval_count, gen.eval_count
        except ConnectionError as exc:
            raise RunnerError(f"Ollama is not reachable at {self._host}: {exc}") from exc
        return _output(record, text, prompt_tokens or 0, completion_tokens or 0)

    async def _pull(self, model: str) -> None:
        log.info("ollama_pulling", model=model)
        self._pulled.add(model)
        try:
            await self._client.pull(model, stream=False)
        except ollama.ResponseError as exc:
            raise PermanentError(f"Ollama could not pull {model!r}: {exc.error}") from exc
        except ConnectionError as exc:
            raise RunnerError(f"Ollama is not reachable at {self._host}: {exc}") from exc

    async def aclose(self) -> None:
        return None


def _ollama_error(model: str, exc: ollama.ResponseError) -> RunnerError:
    if 400 <= exc.status_code < 500:
        return PermanentError(f"Ollama refused the request for {model!r} ({exc.status_code}): {exc.error}")
    return RunnerError(f"Ollama failed on {model!r} ({exc.status_code}): {exc.error}")


# -- transformers ------------------------------------------------------------------------------


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
        return _output(record, tokenizer.decode(new_tokens, skip_special_tokens=True), prompt_len, len(new_tokens))

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
