"""An MLX-quantized copy of a Hugging Face encoder folder, as mlx-community's converters write one:
the quantized safetensors (each quantized weight with its `scales` and `biases`) and config.json
with a `quantization` entry, beside the tokenizer files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def quantized_copy(source: Path, target: Path, bits: int, group_size: int = 64) -> Path:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from minions.agents.macos.runners import mlx_bert

    model, config = mlx_bert.load(source)
    nn.quantize(model, group_size=group_size, bits=bits)
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, target / file.name)
    mx.save_safetensors(str(target / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (target / "config.json").write_text(json.dumps({**config, "quantization": {"group_size": group_size,
                                                                              "bits": bits}}))
    return target
