"""services/api/openai/bounds.py and lines.py's bounded_lines: what is counted before a /v1 request is
decoded, and lines over a limit skipped as they stream (pure functions, no server)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from minions import jsoncodec
from minions.services.api.openai.bounds import MAX_INPUTS, MAX_VALUES, scan
from minions.services.api.openai.lines import Overlong, bounded_lines, lines_of
from minions.services.api.openai.translate import LineError


def _refusal(raw: bytes, endpoint: str = "/v1/embeddings", **where: str) -> LineError | None:
    try:
        scan(raw, endpoint, **where)
    except LineError as exc:
        return exc
    return None


def test_inputs_are_counted_where_an_embeddings_request_holds_them() -> None:
    at_limit = jsoncodec.dumps({"model": "m", "input": ["a"] * MAX_INPUTS})
    assert _refusal(at_limit) is None
    over = jsoncodec.dumps({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)})
    refused = _refusal(over)
    assert refused is not None and refused.param == "body.input"
    assert refused.message == f"at most {MAX_INPUTS} inputs per request"
    # A batch line holds them under `body`; elsewhere (another field, another endpoint) they are not inputs.
    line = jsoncodec.dumps({"custom_id": "c", "body": {"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}})
    assert _refusal(line, within="body") is not None
    assert _refusal(line) is None
    assert _refusal(jsoncodec.dumps({"input": [], "user": ["a"] * (MAX_INPUTS + 1)})) is None
    assert _refusal(over, "/v1/completions") is None
    # Nested items count once each, whatever they hold.
    assert _refusal(jsoncodec.dumps({"input": [["a", "b"]] * MAX_INPUTS})) is None


def test_values_and_depth_are_bounded() -> None:
    refused = _refusal(jsoncodec.dumps({"messages": [1] * MAX_VALUES}), "/v1/chat/completions")
    assert refused is not None and refused.code == "too_many_values"
    assert _refusal(jsoncodec.dumps({"messages": [1] * (MAX_VALUES - 2)}), "/v1/chat/completions") is None
    deep = b'{"a":' + b"[" * 64 + b"]" * 64 + b"}"
    refused = _refusal(deep)
    assert refused is not None and refused.code == "too_deep"
    assert _refusal(b'{"a":' + b"[" * 63 + b"]" * 63 + b"}") is None


def test_invalid_json_is_left_to_the_decoder() -> None:
    assert _refusal(b'{"input": [') is None
    assert _refusal(b"not json") is None


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@pytest.mark.parametrize("seed", range(20))
async def test_bounded_lines_are_lines_of_with_long_ones_skipped(seed: int) -> None:
    rng = random.Random(seed)
    data = b"".join(rng.choice([b"a", b"bb", b"\n", b"cccc", b"\n\n", b"x" * 20]) for _ in range(200))
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    parts = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    limit = rng.randint(1, 30)
    expected = [Overlong(len(line)) if len(line) > limit else line async for line in lines_of(_chunks(parts))]
    assert [line async for line in bounded_lines(_chunks(parts), limit)] == expected
