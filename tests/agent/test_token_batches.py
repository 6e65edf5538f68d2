"""The agent's tokenization (agents/macos/runners/token_batches.py) gives exactly the arrays
`tokenizer(texts, padding=True, truncation=True, max_length=n)` gives, through the Rust backend and
through a slow tokenizer's fallback alike, and its pipeline yields every batch in order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import transformers

from minions.agents.macos.runners import model_paths
from minions.agents.macos.runners.token_batches import TokenBatcher, TokenPipeline

ACCEPTED = frozenset({"input_ids", "attention_mask", "token_type_ids"})
TEXTS = [
    "A cat sits on the mat.",
    "",
    "Ünïcödé — 東京タワー, emoji 🚀 and numbers 3.14159e10",
    "def f(x):\n    return x ** 2  # code",
    " ".join(["long"] * 600),  # past any max_length: truncated
    "Short.",
]


@pytest.fixture(scope="module")
def path() -> str:
    if not model_paths.bundled_minilm_available():
        pytest.skip("the bundled all-MiniLM-L6-v2 is not installed")
    return str(model_paths.resolve(model_paths.MINILM))


class _SlowTokenizer:
    """A tokenizer without a Rust backend (transformers 5 makes every bundled one fast): the fallback."""

    is_fast = False

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)


@pytest.mark.parametrize("max_length", [8, 128, 256, 512])
@pytest.mark.parametrize("slow", [False, True])
def test_the_arrays_are_the_tokenizers_own(path: str, max_length: int, slow: bool) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batcher = TokenBatcher(_SlowTokenizer(tokenizer) if slow else tokenizer, ACCEPTED)
    assert batcher.fast is not slow
    got = batcher.encode(TEXTS, max_length)
    want = tokenizer(TEXTS, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    assert set(got) == set(ACCEPTED)
    for field in ACCEPTED:
        assert got[field].dtype == np.int64
        np.testing.assert_array_equal(got[field], want[field], err_msg=field)


def test_a_max_length_past_the_models_is_cut_to_the_models(path: str) -> None:
    """The tokenizer's own call would pass 600 tokens to a model of 512 positions (which fails on them)."""
    batcher = TokenBatcher(transformers.AutoTokenizer.from_pretrained(path), ACCEPTED)
    assert batcher.encode(TEXTS, 8192)["input_ids"].shape == (len(TEXTS), 512)


def test_only_the_fields_the_model_takes_and_the_mask(path: str) -> None:
    batcher = TokenBatcher(transformers.AutoTokenizer.from_pretrained(path), frozenset({"input_ids"}))
    assert set(batcher.encode(["one", "two words"], 16)) == {"input_ids", "attention_mask"}


def test_the_pipeline_yields_every_batch_in_order(path: str) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    batcher = TokenBatcher(tokenizer, ACCEPTED)
    pipeline = TokenPipeline(batcher)
    try:
        groups = [TEXTS[i : i + 2] for i in range(0, len(TEXTS), 2)]
        got = list(pipeline.batches(groups, 64))
        assert len(got) == len(groups)
        for group, arrays in zip(groups, got, strict=True):
            np.testing.assert_array_equal(arrays["input_ids"], batcher.encode(group, 64)["input_ids"])
        assert list(pipeline.batches([], 64)) == []
    finally:
        pipeline.shutdown()
