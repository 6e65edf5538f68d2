"""OllamaDouble: a test double of an Ollama server, speaking the HTTP API the `ollama` client uses
(/api/tags, /api/chat, /api/generate, /api/pull; streaming and not), backed by a real tiny causal
LM, so the agent's Ollama runner is tested through the real client over real HTTP.

Like Ollama with several slots, it serves requests concurrently (generation runs on threads), and
it counts how many were in flight at once (`max_in_flight`), so a test can prove requests overlap.
`delay_s` holds every answer that long first, to make the overlap (and a cancellation) certain.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web


class OllamaDouble:
    def __init__(self, model_dir: Path, models: list[str], pullable: list[str] | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        self.model: Any = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        self.models = list(models)
        self.pullable = set(pullable or [])
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self.answered = 0  # generations that ran to the end (a cancelled request does not)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/tags", self._tags)
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/api/generate", self._generate)
        app.router.add_post("/api/pull", self._pull)
        return app

    async def start(self) -> str:
        # As Ollama drops a request whose client went away, the handler is cancelled then.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # -- endpoints --------------------------------------------------------------------------

    async def _tags(self, request: web.Request) -> web.Response:
        return _json({"models": [_model_entry(m) for m in self.models]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(("/api/chat", body))
        if (missing := self._missing(body["model"])) is not None:
            return missing
        prompt = self._chat_prompt(body["messages"])
        return await self._answer(
            request, body, prompt, lambda text: {"message": {"role": "assistant", "content": text}}
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(("/api/generate", body))
        if (missing := self._missing(body["model"])) is not None:
            return missing
        prompt = body.get("prompt", "")
        if body.get("system"):
            prompt = f"{body['system']}\n\n{prompt}"
        return await self._answer(request, body, prompt, lambda text: {"response": text})

    async def _pull(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(("/api/pull", body))
        name = body.get("model") or body.get("name")
        if name not in self.pullable:
            return _json({"error": "pull model manifest: file does not exist"}, status=500)
        self.models.append(name)
        return _json({"status": "success"})

    # -- generation -----------------------------------------------------------------------

    def _missing(self, model: str) -> web.Response | None:
        # Like Ollama, a bare name means its ":latest" tag.
        if model in self.models or f"{model}:latest" in self.models:
            return None
        return _json({"error": f"model '{model}' not found"}, status=404)

    def _chat_prompt(self, messages: list[dict[str, str]]) -> str:
        return "\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:"

    def _complete(self, prompt: str, options: dict[str, Any]) -> tuple[list[str], int, int]:
        import torch

        encoded = self.tokenizer(prompt, return_tensors="pt")
        temperature = float(options.get("temperature", 0.8))
        sampling: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            sampling["temperature"] = temperature
        if "seed" in options:
            torch.manual_seed(int(options["seed"]))
        with torch.inference_mode():
            out = self.model.generate(
                **encoded,
                max_new_tokens=int(options.get("num_predict", 16)),
                pad_token_id=self.tokenizer.pad_token_id,
                **sampling,
            )
        new = out[0, encoded["input_ids"].shape[1] :].tolist()
        pieces = [self.tokenizer.decode([t], skip_special_tokens=True) for t in new]
        return pieces, encoded["input_ids"].shape[1], len(new)

    def reset_counts(self) -> None:
        self.requests.clear()
        self.max_in_flight = self.answered = 0

    async def _answer(self, request: web.Request, body: dict[str, Any], prompt: str, shape: Any) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            return await self._respond(request, body, prompt, shape)
        finally:
            self.in_flight -= 1

    async def _respond(self, request: web.Request, body: dict[str, Any], prompt: str, shape: Any) -> web.StreamResponse:
        started = time.monotonic_ns()
        pieces, prompt_count, eval_count = await asyncio.to_thread(self._complete, prompt, body.get("options") or {})
        self.answered += 1
        final = {
            "model": body["model"],
            "created_at": _now(),
            "done": True,
            "done_reason": "length",
            "total_duration": time.monotonic_ns() - started,
            "load_duration": 1_000_000,
            "prompt_eval_count": prompt_count,
            "prompt_eval_duration": 2_000_000,
            "eval_count": eval_count,
            "eval_duration": 3_000_000,
        }
        if body.get("stream", True) is False:
            return _json({**final, **shape("".join(pieces))})
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for piece in pieces:
            chunk = {"model": body["model"], "created_at": _now(), "done": False, **shape(piece)}
            await response.write(orjson.dumps(chunk) + b"\n")
        await response.write(orjson.dumps({**final, **shape("")}) + b"\n")
        await response.write_eof()
        return response


def _model_entry(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": name,
        "modified_at": "2026-11-20T09:12:44.123456+01:00",
        "size": 1321098329,
        "digest": hashlib.sha256(name.encode()).hexdigest(),  # one per model, as Ollama's are
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": "llama",
            "families": ["llama"],
            "parameter_size": "1.2B",
            "quantization_level": "Q8_0",
        },
    }


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
