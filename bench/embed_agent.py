"""Embedding throughput: the agent's runner against plain fp32 transformers, side by side.

Both use the same model, threads and device, mean pooling and L2 normalisation. The agent runs as
it would for a task that sets no batch size: in the precision it chooses at load (--precision,
default auto: the fastest this device runs natively whose vectors stay at cosine >= 0.9999 to
fp32) and its device-chosen batch size; the baselines run fp32 at --batch-size. Variants alternate
within each round (this machine is shared and noisy, so only side-by-side numbers compare), and
each figure is the median of the rounds. It also reports the minimum cosine of the agent's
vectors to sentence-transformers' fp32 vectors over all the benchmark's sentences.

    python bench/embed_agent.py [--sentences 2000] [--rounds 5] [--batch-size 64] [--threads 2]
                                [--precision auto|fp32|bf16|fp16]

Baselines: "plain" runs batches in input order, as a straightforward script would; "plain-sorted"
sorts by length first (the fastest plain recipe). Both ratios are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minions.agents.macos.protocol import InputRef, OutputRef, Subtask
from minions.agents.macos.runners import model_paths
from minions.agents.macos.runners.embedding import EmbeddingRunner
from minions.agents.macos.runners.precision import PRECISION_SETTINGS
from minions.agents.macos.runners.torch_setup import TorchSettings

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_WORDS = (
    "idle laptops embed documents overnight while owners sleep the queue hands each executor a lease "
    "heartbeats keep it alive results land in object storage exactly once apple silicon shares memory "
    "between cpu and gpu so batches must stay modest postgres decides who wins every claim"
).split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """Sentences of 10 to 40 words (about 33 tokens on average), varied as real text is."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(10, 40))).capitalize() + "." for _ in range(n)]


class Plain:
    """Plain transformers: tokenizer + AutoModel, mean pooling, L2 normalisation."""

    def __init__(self, model_name: str, device: str) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = model_paths.resolve(model_name)
        self.device = device
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModel.from_pretrained(path).to(device)
        self.model = model.float().eval()

    def encode(self, texts: list[str], batch_size: int, sort: bool) -> list[list[float]]:
        import torch

        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True) if sort else range(len(texts))
        order = list(order)
        out: list[list[float]] = [[] for _ in texts]
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                enc = self.tokenizer(
                    [texts[i] for i in idx], padding=True, truncation=True, max_length=256, return_tensors="pt"
                ).to(self.device)
                hidden = self.model(**enc)[0].float()
                mask = enc["attention_mask"].unsqueeze(-1).float()
                pooled = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=1)
                for i, row in zip(idx, pooled.cpu().tolist(), strict=True):
                    out[i] = row
        return out


def agent_subtask(model: str, n: int, batch_size: int | None) -> Subtask:
    return Subtask(
        team="bench",
        project="bench",
        task_name="embed",
        subtask_id=0,
        attempt=1,
        kind="embedding",
        model=model,
        params={} if batch_size is None else {"batch_size": batch_size},
        input=InputRef(url="", range=[0, 0], records=n),
        output=OutputRef(url=""),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--model", default=MODEL, help="model id or local folder")
    parser.add_argument("--precision", default="auto", choices=PRECISION_SETTINGS, help="the agent's (default auto)")
    parser.add_argument("--agent-batch-size", type=int, default=None, help="default: the agent's choice")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    texts = sentences(args.sentences)
    records = [{"id": i, "text": t} for i, t in enumerate(texts)]
    runner = EmbeddingRunner(TorchSettings(device=args.device, threads=args.threads, precision=args.precision))
    plain = Plain(args.model, args.device)
    sub = agent_subtask(args.model, len(records), args.agent_batch_size)
    loop = asyncio.new_event_loop()

    def run_agent() -> list[Any]:
        return loop.run_until_complete(runner.run(sub, records))

    variants = {
        "agent": run_agent,
        "plain": lambda: plain.encode(texts, args.batch_size, sort=False),
        "plain-sorted": lambda: plain.encode(texts, args.batch_size, sort=True),
    }
    vectors: dict[str, Any] = {}
    for name, fn in variants.items():  # warm-up: load the models, fill the allocator caches
        vectors[name] = fn()
    rates: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_no in range(args.rounds):
        for name in names[round_no % 3 :] + names[: round_no % 3]:  # rotate who goes first
            if args.device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            variants[name]()
            rates[name].append(len(texts) / (time.perf_counter() - started))
    loop.run_until_complete(runner.aclose())
    loop.close()
    (choice,) = runner.precision_choices()
    agent_batch = args.agent_batch_size or (runner._loaded.batch_size if runner._loaded else None)
    min_cosine = min_cosine_to_sentence_transformers(args.model, args.device, texts, vectors["agent"])

    median = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"{len(texts)} sentences, {args.threads} threads, device {args.device}, median of {args.rounds} "
        f"alternating rounds; plain: fp32, batch {args.batch_size}; agent: {choice.precision} "
        f"({choice.setting}; probe cosine {choice.cosine:.6f}), batch {agent_batch}"
    )
    for name in names:
        print(f"  {name:13s} {median[name]:8.1f} sentences/s   (rounds: {', '.join(f'{r:.0f}' for r in rates[name])})")
    print(f"  agent / plain-sorted = {median['agent'] / median['plain-sorted']:.3f}")
    print(f"  agent / plain        = {median['agent'] / median['plain']:.3f}   (target >= 1.6)")
    print(f"  min cosine, agent to sentence-transformers fp32, over all {len(texts)} sentences: {min_cosine:.6f}")
    print(json.dumps({
        "median_sentences_per_s": {k: round(v, 1) for k, v in median.items()},
        "precision": choice.precision,
        "agent_batch_size": agent_batch,
        "min_cosine_to_sentence_transformers": round(min_cosine, 7),
    }))


def min_cosine_to_sentence_transformers(model: str, device: str, texts: list[str], vectors: list[Any]) -> float:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(model_paths.resolve(model), device=device)
    expected = np.asarray(reference.encode(texts, normalize_embeddings=True, batch_size=64))
    got = np.asarray([v["embedding"] for v in vectors])
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    return float(np.min(np.sum(got * expected, axis=1)))


if __name__ == "__main__":
    main()
