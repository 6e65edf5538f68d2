"""The `completion` kind, with two backends: a local Ollama server (the default, as in the paper;
`ollama_completion.py`) or transformers' `generate` on the agent's own device
(`transformers_completion.py`). This module holds what both share.

Both take records `{"id", "prompt"}` or `{"id", "messages": [{"role", "content"}]}` and params
`temperature`, `max_tokens`, `seed`, `system`, and both answer
`{"id", "text", "usage": {"prompt_tokens", "completion_tokens"}}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minions.agents.macos.runners.base import PermanentError, Record, string_field

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


def output_record(record: Record, text: str, prompt_tokens: int, completion_tokens: int) -> Record:
    return {
        "id": record["id"],
        "text": text,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


