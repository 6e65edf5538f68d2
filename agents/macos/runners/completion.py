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

from minions.agents.macos.runners.base import PermanentError, Record, checked_params, string_field
from minions.kinds import PARAMS

# What the transformers backend uses when a task sets none (minions/kinds.py says why).
DEFAULT_TEMPERATURE: float = PARAMS["completion"]["temperature"].default
DEFAULT_MAX_TOKENS: int = PARAMS["completion"]["max_tokens"].default


@dataclass(frozen=True)
class CompletionParams:
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    system: str | None = None

    @classmethod
    def parse(cls, params: dict[str, Any]) -> CompletionParams:
        return cls(**checked_params("completion", params))


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


