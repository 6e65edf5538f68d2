"""Every inference engine this machine has, side by side: torch (transformers) and MLX.

For each engine installed here it loads the embedding model and the completion model as the agent
would (the precision and batch size the engine's runner chooses at load), then times them in
alternating rounds (engines take turns, so a noisy neighbour weighs on both alike) and prints the
median of the rounds as a table, with parity against torch fp32: the minimum cosine of each
engine's vectors to sentence-transformers', and whether its greedy tokens are transformers'.

    python bench/backends.py [--sentences 64] [--prompts 8] [--max-tokens 32] [--rounds 3]
                             [--threads N] [--embedding-model NAME] [--completion-model PATH]

The completion model defaults to the tests' tiny random Llama (minions/testing/tiny_lm.py, built
in a temporary folder, no download): enough for parity; for a meaningful tokens/s give a real
model folder (a Hugging Face Llama/Qwen/Mistral in safetensors). Speed only means something on
Apple silicon, where MLX runs on the GPU; MLX's Linux CPU build (`mlx[cpu]`) uses a reference
BLAS and is slow by design.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from rich.console import Console
from rich.table import Table

from bench.embed_agent import sentences  # the texts of the embedding figures, 10-40 words
from minions.agents.macos import hardware
from minions.agents.macos.runners import mlx_setup, model_paths
from minions.agents.macos.runners.completion import CompletionParams
from minions.agents.macos.runners.embedding import EmbeddingParams, EmbeddingRunner
from minions.agents.macos.runners.mlx_setup import MLXSettings
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner

console = Console(stderr=True)


def alternate(runs: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each run per round, after one warm-up each; the order flips every round."""
    for name, run in runs.items():
        console.log(f"warm-up {name}")
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for index in range(rounds):
        for name in list(runs) if index % 2 == 0 else list(reversed(runs)):
            started = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - started)
            console.log(f"round {index + 1}/{rounds} {name}: {times[name][-1]:.2f} s")
    return times


def embedding_rows(args: argparse.Namespace, engines: list[str]) -> list[list[str]]:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    texts = sentences(args.sentences)
    model = args.embedding_model
    reference = SentenceTransformer(model_paths.resolve(model), device="cpu").encode(
        texts, normalize_embeddings=True, batch_size=64)
    device = hardware.choose_device(True)
    runners: dict[str, Any] = {"torch": EmbeddingRunner(TorchSettings(device=device, threads=args.threads))}
    if "mlx" in engines:
        from minions.agents.macos.runners.mlx_embedding import MLXEmbeddingRunner

        runners["mlx"] = MLXEmbeddingRunner(MLXSettings())
    params = EmbeddingParams()
    vectors: dict[str, Any] = {}

    def run(name: str) -> Callable[[], Any]:
        def embed() -> None:
            vectors[name] = runners[name].encode(model, texts, params)

        return embed

    times = alternate({name: run(name) for name in runners}, args.rounds)
    rows = []
    for name, runner in runners.items():
        got = np.asarray(vectors[name], dtype=np.float64)
        cosine = float(((got * reference).sum(axis=1) / np.linalg.norm(got, axis=1)).min())
        report = runner.precision_reports()[0]
        batch = runner._loaded.batch_size  # what it chose at load
        engine_device = report["device"] if name == "mlx" else device
        rows.append(["embedding", name, engine_device, f"{report['precision']}{_quantized(report)}", str(batch),
                     f"{len(texts) / statistics.median(times[name]):,.1f} sentences/s", f"cosine {cosine:.7f}"])
    return rows


def completion_rows(args: argparse.Namespace, engines: list[str], folder: str) -> list[list[str]]:
    records = [{"id": i, "prompt": text} for i, text in enumerate(sentences(args.prompts, seed=1))]
    params = CompletionParams(temperature=0, max_tokens=args.max_tokens)
    device = hardware.choose_device(True)
    settings = TorchSettings(device=device, threads=args.threads)
    runners: dict[str, Any] = {"torch": TransformersCompletionRunner(settings)}
    if "mlx" in engines:
        from minions.agents.macos.runners.mlx_completion import MLXCompletionRunner

        runners["mlx"] = MLXCompletionRunner(MLXSettings())
    outputs: dict[str, list[dict[str, Any]]] = {}

    def run(name: str) -> Callable[[], Any]:
        def generate() -> None:
            outputs[name] = runners[name].generate(folder, records, params)

        return generate

    times = alternate({name: run(name) for name in runners}, args.rounds)
    rows = []
    for name, runner in runners.items():
        tokens = sum(o["usage"]["completion_tokens"] for o in outputs[name])
        same = [(o["text"], o["usage"]) for o in outputs[name]] == [(o["text"], o["usage"]) for o in outputs["torch"]]
        precision = runner._loaded.precision if name == "mlx" else ("fp16" if device in ("mps", "cuda") else "fp32")
        engine_device = f"mlx-{_mlx_device()}" if name == "mlx" else device
        rows.append(["completion", name, engine_device, precision, str(runner.batch_size()),
                     f"{tokens / statistics.median(times[name]):,.1f} tokens/s",
                     "greedy tokens = transformers'" if same else "greedy tokens DIFFER"])
    return rows


def _quantized(report: dict[str, Any]) -> str:
    return f" ({report['quantization']})" if report.get("quantization") else ""


def _mlx_device() -> str:
    import mlx.core as mx

    return mlx_setup.device_name(mx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--embedding-model", default=model_paths.MINILM)
    parser.add_argument("--completion-model", default=None, help="a local model folder (default: the tiny test Llama)")
    args = parser.parse_args()
    engines = ["torch", *(["mlx"] if mlx_setup.available() else [])]
    if "mlx" not in engines:
        console.log(f"MLX is not installed: only torch runs ({mlx_setup.EXTRA_HINT}, or 'mlx[cpu]' mlx-lm on Linux)")
    rows = embedding_rows(args, engines)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.completion_model
        if folder is None:
            from minions.testing import tiny_lm

            folder = str(tiny_lm.build(Path(tmp) / "tiny-llama"))
        rows += completion_rows(args, engines, folder)
    table = Table(title=f"Engines on {hardware.chip_name()} ({platform.system()} {platform.machine()}), "
                        f"median of {args.rounds} rounds")
    for column in ("kind", "backend", "device", "precision", "batch", "rate", "parity with torch fp32"):
        table.add_column(column, justify="right" if column in ("batch", "rate") else "left")
    for row in rows:
        table.add_row(*row)
    out = Console(width=160)
    out.print(table)
    if "mlx" in engines and _mlx_device() == "cpu":
        out.print("MLX runs on its CPU build here (reference BLAS): the parity columns count, "
                        "the MLX speed does not. Run this on Apple silicon for speed.")


if __name__ == "__main__":
    main()
