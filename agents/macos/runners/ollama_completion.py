"""The `completion` kind on a local Ollama server (the default backend, as in the paper)."""

from __future__ import annotations

from typing import Any

import ollama

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners.base import PermanentError, Record, RunnerError, require_model
from minions.agents.macos.runners.completion import CompletionParams, output_record, record_messages
from minions.logging import get_logger

log = get_logger(__name__)



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
        return output_record(record, text, prompt_tokens or 0, completion_tokens or 0)

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

