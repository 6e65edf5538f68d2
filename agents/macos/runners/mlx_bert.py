"""A BERT encoder forward in MLX, loading a Hugging Face folder's safetensors or an MLX-converted
(optionally quantized) one.

Our own forward (about sixty lines) rather than `mlx-embeddings`: that package pulls opencv,
pyarrow, pandas and datasets into every Mac agent for one encoder we can write here and test
against transformers (tests/agent/test_mlx.py). The module names follow Hugging Face's BertModel,
so both Hugging Face checkpoints and mlx-community conversions (which keep those names, with
`scales`/`biases` beside each quantized weight) load without renaming.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

SUPPORTED = frozenset({"bert"})


class Unsupported(ValueError):
    """A folder this forward cannot run (another architecture, or weights that do not match)."""


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        if raw.get("model_type") not in SUPPORTED:
            raise Unsupported(f"model_type {raw.get('model_type')!r} (the MLX encoder runs {', '.join(SUPPORTED)})")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise Unsupported(f"position_embedding_type {raw['position_embedding_type']!r}")
        if raw.get("hidden_act", "gelu") != "gelu":
            raise Unsupported(f"hidden_act {raw['hidden_act']!r}")
        try:
            return cls(**{name: raw[name] for name in cls.__dataclass_fields__ if name != "layer_norm_eps"},
                       layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)))
        except KeyError as exc:
            raise Unsupported(f"config.json lacks {exc}") from exc


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, ids: mx.array, types: mx.array) -> mx.array:
        positions = mx.arange(ids.shape[1])[None, :]
        x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings(types)
        return self.LayerNorm(x)  # type: ignore[no-any-return]


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        b, n, d = x.shape

        def split(t: mx.array) -> mx.array:
            return t.reshape(b, n, self.heads, d // self.heads).transpose(0, 2, 1, 3)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(d // self.heads), mask=bias)
        return out.transpose(0, 2, 1, 3).reshape(b, n, d)


class _Dense(nn.Module):
    """A projection, then LayerNorm over it plus the residual (BERT's `output` blocks)."""

    def __init__(self, inside: int, outside: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(inside, outside)
        self.LayerNorm = nn.LayerNorm(outside, eps=eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)  # type: ignore[no-any-return]


class _Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = _SelfAttention(c)  # Hugging Face's name for it
        self.output = _Dense(c.hidden_size, c.hidden_size, c.layer_norm_eps)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        return self.output(self.self(x, bias), x)


class _Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def __call__(self, x: mx.array) -> mx.array:
        return nn.gelu(self.dense(x))  # type: ignore[no-any-return]  # exact (erf) GELU, as BERT's


class _Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = _Attention(c)
        self.intermediate = _Intermediate(c)
        self.output = _Dense(c.intermediate_size, c.hidden_size, c.layer_norm_eps)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        attended = self.attention(x, bias)
        return self.output(self.intermediate(attended), attended)


class _Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = [_Layer(c) for _ in range(c.num_hidden_layers)]


class BertModel(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)

    def __call__(self, ids: mx.array, mask: mx.array, types: mx.array | None = None) -> mx.array:
        """The last hidden state (batch, tokens, hidden) of `ids` under attention `mask` (1 = token)."""
        x = self.embeddings(ids, mx.zeros_like(ids) if types is None else types)
        # Padding gets a large negative score: softmax gives it (almost exactly) zero weight.
        bias = ((1 - mask[:, None, None, :].astype(x.dtype)) * mx.finfo(x.dtype).min).astype(x.dtype)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x


def load(folder: Path) -> tuple[BertModel, dict[str, Any]]:
    """The encoder in `folder` (config.json + *.safetensors) and its config; `Unsupported` when this
    forward cannot run it."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise Unsupported(f"no readable config.json in {folder}: {exc}") from exc
    config = BertConfig.from_dict(raw)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise Unsupported(f"no safetensors weights in {folder} (the MLX runner reads no .bin files)")
    weights: dict[str, mx.array] = {}
    for file in files:
        weights.update(mx.load(str(file)))  # type: ignore[arg-type]
    weights = {k.removeprefix("bert."): v for k, v in weights.items()}
    model = BertModel(config)
    quantized = raw.get("quantization") or raw.get("quantization_config")
    if isinstance(quantized, dict) and "bits" in quantized:
        nn.quantize(model, group_size=int(quantized.get("group_size", 64)), bits=int(quantized["bits"]),
                    class_predicate=lambda path, module: f"{path}.scales" in weights)
    wanted = {name for name, _ in tree_flatten(model.parameters())}
    missing = wanted - set(weights)
    if missing:
        raise Unsupported(f"weights missing for {len(missing)} parameters, e.g. {sorted(missing)[:3]}")
    model.load_weights([(k, v) for k, v in weights.items() if k in wanted], strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model, raw

