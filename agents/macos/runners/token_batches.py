"""Texts to the model's input arrays, off the device's critical path.

Measured on an H200 (py-spy on the agent during bench/embed_system.py), the agent's samples were 39%
`BatchEncoding.convert_to_tensors` and 16% `flatten` in the same path: `tokenizer(texts,
return_tensors="pt")` builds Python lists of token ids and turns them into tensors one element at a
time, on the one thread that also drives the device, which waited. Here:

- The fast tokenizer's Rust backend encodes a batch (`encode_batch`: parallel across texts, without
  the GIL) with truncation and padding configured on a private copy (the shared tokenizer is left as
  it was), and each array is built in one `np.array` call over the rows, not element by element.
  The ids are exactly the ones `tokenizer(texts, padding=True, truncation=True, max_length=n)` gives
  (tests/agent/test_token_batches.py holds that).
- `TokenPipeline` tokenizes the next batch on a worker thread while the device runs the current one,
  so the device never waits for the tokenizer after the first batch.
- On CUDA the arrays go through pinned host memory and are copied without blocking the host.

A tokenizer without a Rust backend (a slow, pure-Python one) falls back to the tokenizer's own call.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

# The arrays a BERT-like encoder takes, as the tokenizer names them.
FIELDS = ("input_ids", "attention_mask", "token_type_ids")


class TokenBatcher:
    """`encode(texts, max_length)`: the model's input arrays (int64, padded to the batch's longest)."""

    def __init__(self, tokenizer: Any, accepted: frozenset[str]) -> None:
        self._tokenizer = tokenizer
        self._fields = tuple(f for f in FIELDS if f in accepted)
        self._backends: dict[int, Any] = {}  # per max_length: a configured copy of the Rust tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        self._source = backend.to_str() if backend is not None else None

    @property
    def fast(self) -> bool:
        return self._source is not None

    def encode(self, texts: Sequence[str], max_length: int) -> dict[str, np.ndarray]:
        """The fields the model takes, and always `attention_mask` (pooling reads it)."""
        wanted = {*self._fields, "attention_mask"}
        if self._source is None:
            encoded = self._tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                                      return_tensors="np")
            return {k: np.asarray(encoded[k], dtype=np.int64) for k in FIELDS if k in wanted and k in encoded}
        encodings = self._backend(max_length).encode_batch(list(texts))
        rows = {"input_ids": lambda e: e.ids, "attention_mask": lambda e: e.attention_mask,
                "token_type_ids": lambda e: e.type_ids}
        return {k: np.array([rows[k](e) for e in encodings], dtype=np.int64) for k in FIELDS if k in wanted}

    def _backend(self, max_length: int) -> Any:
        backend = self._backends.get(max_length)
        if backend is None:
            from tokenizers import Tokenizer

            assert self._source is not None
            backend = Tokenizer.from_str(self._source)
            limit = min(max_length, _model_max_length(self._tokenizer))
            backend.enable_truncation(limit)
            pad_id = self._tokenizer.pad_token_id if self._tokenizer.pad_token_id is not None else 0
            backend.enable_padding(pad_id=pad_id, pad_token=self._tokenizer.pad_token or "[PAD]",
                                   pad_type_id=getattr(self._tokenizer, "pad_token_type_id", 0) or 0,
                                   direction=getattr(self._tokenizer, "padding_side", "right"))
            self._backends[max_length] = backend
        return backend


def _model_max_length(tokenizer: Any) -> int:
    """The tokenizer's own limit (transformers truncates to the smaller of it and `max_length`)."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else 1_000_000


class TokenPipeline:
    """Batches of texts encoded one ahead on a worker thread: `batches(groups, max_length)` yields
    each group's arrays while the next group is being encoded."""

    def __init__(self, batcher: TokenBatcher) -> None:
        self._batcher = batcher
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")

    def batches(self, groups: Sequence[Sequence[str]], max_length: int) -> Iterator[dict[str, np.ndarray]]:
        if not groups:
            return
        ahead = self._pool.submit(self._batcher.encode, groups[0], max_length)
        for index in range(len(groups)):
            current = ahead.result()
            if index + 1 < len(groups):
                ahead = self._pool.submit(self._batcher.encode, groups[index + 1], max_length)
            yield current

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def to_device(torch: Any, arrays: dict[str, np.ndarray], device: str) -> dict[str, Any]:
    """The arrays as tensors on `device`: shared with numpy on the CPU; through pinned memory, copied
    without blocking the host, on CUDA (the forward queued after them waits for them on the GPU)."""
    tensors = {k: torch.from_numpy(v) for k, v in arrays.items()}
    if device == "cpu":
        return tensors
    if device.startswith("cuda"):
        return {k: t.pin_memory().to(device, non_blocking=True) for k, t in tensors.items()}
    return {k: t.to(device) for k, t in tensors.items()}
