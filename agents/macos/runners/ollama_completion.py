"""The `completion` kind on a local Ollama server (the default backend, as in the paper).

Up to `parallel` requests of a subtask are in flight at once (Ollama serves as many at a time as
it has slots, OLLAMA_NUM_PARALLEL, and queues the rest), results stay in input order, and
cancelling the subtask cancels every request in flight at once (closing a connection makes Ollama
drop the request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import ollama

from minions.agents.macos.protocol import Subtask
from minions.agents.macos.runners.base import PermanentError, Record, RunnerError, require_model
from minions.agents.macos.runners.completion import CompletionParams, output_record, record_messages
from minions.logging import get_logger

log = get_logger(__name__)


class OllamaCompletionRunner:
    kind = "completion"

    def __init__(
        self,
        host: str,
        allow_pull: bool = False,
        client: ollama.AsyncClient | None = None,
        parallel: int = 1,
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be >= 1")
        self._host = host
        self._allow_pull = allow_pull
        self._client = client or ollama.AsyncClient(host=host)
        self._parallel = parallel
        # One pull per model and runner: the run that started it (its requests wait for it and
        # retry) and the pull itself (done: a later run that still misses the model gives up).
        self._pulls: dict[str, tuple[object, asyncio.Future[None]]] = {}
        # Per model name Ollama listed: its digest (the model's identity) and quantization.
        self._identities: dict[str, dict[str, Any]] = {}

    async def advertised_models(self) -> list[str]:
        """The models Ollama already holds (`ollama list`); none when it is not running."""
        try:
            listing = await self._client.list()
        except (ConnectionError, ollama.ResponseError) as exc:
            log.warning("ollama_unreachable", host=self._host, error=str(exc))
            return []
        names = [m.model for m in listing.models if m.model]
        for m in listing.models:
            if m.model and m.digest:
                identity = {"fingerprint": _fingerprint(m.digest), "backend": "ollama",
                            "precision": m.details.quantization_level if m.details else None}
                self._identities[m.model] = identity
                if m.model.endswith(":latest"):
                    self._identities.setdefault(m.model.removesuffix(":latest"), identity)
        # Tasks often say "llama3.2" for what Ollama lists as "llama3.2:latest": advertise both.
        bare = [n.removesuffix(":latest") for n in names if n.endswith(":latest")]
        return list(dict.fromkeys([*names, *bare]))

    async def fingerprints(self, models: Sequence[str]) -> list[dict[str, Any]]:
        """Ollama's digest of each of `models` it listed (advertised_models), with its quantization.
        A model pulled at its first subtask is not listed yet: it counts as unknown until the agent
        registers again."""
        return [{"model": m, **self._identities[m]} for m in models if m in self._identities]

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
        run = object()
        results: list[Record | None] = [None] * len(prepared)
        pending = iter(range(len(prepared)))  # shared by the workers: each record is taken once

        async def worker() -> None:
            for i in pending:
                record, messages = prepared[i]
                results[i] = await self._one(run, model, record, messages, params, options)

        workers = [asyncio.create_task(worker()) for _ in range(min(self._parallel, len(prepared)))]
        try:
            # The first failure ends the subtask; cancellation (owner back, lease lost) reaches
            # every request in flight through the finally below.
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        return [r for r in results if r is not None]

    async def _one(
        self,
        run: object,
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
            await self._pull_once(run, model, exc)
        try:
            return await self._request(model, record, messages, params, options)
        except ollama.ResponseError as exc:
            raise _ollama_error(model, exc) from exc

    async def _pull_once(self, run: object, model: str, missing: ollama.ResponseError) -> None:
        """Pull `model` unless this run already does (then wait for that pull); a model still
        missing after an earlier run's pull cannot be fixed by pulling again."""
        started = self._pulls.get(model)
        if started is not None and started[1].cancelled():
            started = None  # the run that pulled was cancelled: the pull never finished
        if not self._allow_pull or (started is not None and started[0] is not run):
            raise PermanentError(
                f"model {model!r} is not in the local Ollama ({self._host}); run `ollama pull {model}` "
                "or start the agent with --allow-pull"
            ) from missing
        if started is None:
            started = (run, asyncio.ensure_future(self._pull(model)))
            self._pulls[model] = started
        await started[1]

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
        try:
            await self._client.pull(model, stream=False)
        except ollama.ResponseError as exc:
            raise PermanentError(f"Ollama could not pull {model!r}: {exc.error}") from exc
        except ConnectionError as exc:
            raise RunnerError(f"Ollama is not reachable at {self._host}: {exc}") from exc

    async def aclose(self) -> None:
        return None


def _fingerprint(digest: str) -> str:
    """Ollama lists a model's digest as bare hex (the API) or sha256:<hex> (its manifests): one form."""
    return digest if ":" in digest else f"sha256:{digest}"


def _ollama_error(model: str, exc: ollama.ResponseError) -> RunnerError:
    if 400 <= exc.status_code < 500:
        return PermanentError(f"Ollama refused the request for {model!r} ({exc.status_code}): {exc.error}")
    return RunnerError(f"Ollama failed on {model!r} ({exc.status_code}): {exc.error}")

