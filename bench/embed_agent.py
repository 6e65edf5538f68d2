"""Embedding throughput: the agent's runner against the plain scripts a user would write instead.

Arms, all on the same model, threads and device, alternating within each round in one process (this
machine is shared and noisy, so only side-by-side numbers compare); each figure is the median of
the rounds:

- agent: the agent's EmbeddingRunner as the agent runs it for a task that sets no batch size
  (`runner.run` on a subtask: length-sorted batches, numpy float32 rows, token counts), in the
  precision and weights it chooses at load (--precision, default auto: the fastest this device runs
  natively whose vectors stay at cosine >= 0.9999 to fp32) and its device-chosen batch size;
- st-fp32: `SentenceTransformer(model).encode(texts, normalize_embeddings=True)`;
- st-autocast: the same under `torch.autocast(device, dtype=torch.bfloat16)` (fp16 on MPS);
- st-bf16: the same after `model.to(torch.bfloat16)` (fp16 on MPS): the one-line cast.

The plain arms use sentence-transformers' default batch size (32) unless --st-batch-size says
otherwise. Each also has a tuned twin (`<arm>@best`, unless --no-tuned): in every round it runs at
batch sizes 32, 64, ... up to 1024 (--tuned-sizes), stopping once two sizes in a row bring nothing,
and counts its best; so the agent is compared with a script a user tuned, not only a default one.
Printed: sentences/s per arm (median, and every round), the ratio agent / fastest plain
arm (target >= 1.0), and each arm's minimum and mean cosine to st-fp32 over all the sentences.

    python bench/embed_agent.py [--sentences 2000] [--rounds 5] [--threads 2] [--device cpu]
                                [--precision auto|fp32|bf16|fp16] [--st-batch-size 32]
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench import limits, machine
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


def plain_arms(model: str, device: str, texts: list[str], batch_size: int) -> dict[str, Callable[[], Any]]:
    """The three scripts a user would write with sentence-transformers, each on its own model copy."""
    import torch
    from sentence_transformers import SentenceTransformer

    half = torch.float16 if device == "mps" else torch.bfloat16
    path = model_paths.resolve(model)
    fp32 = SentenceTransformer(path, device=device)
    autocast = SentenceTransformer(path, device=device)
    cast = SentenceTransformer(path, device=device).to(half)

    def encode(st: Any) -> Any:
        return st.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)

    def under_autocast() -> Any:
        with torch.autocast(device_type=device, dtype=half):
            return encode(autocast)

    return {"st-fp32": lambda: encode(fp32), "st-autocast": under_autocast, "st-bf16": lambda: encode(cast)}


def tuned_arms(model: str, device: str, texts: list[str]) -> dict[str, Callable[[int], Any]]:
    """The plain scripts, each taking the batch size to run at (the tuned twins)."""
    import torch
    from sentence_transformers import SentenceTransformer

    half = torch.float16 if device == "mps" else torch.bfloat16
    path = model_paths.resolve(model)
    fp32 = SentenceTransformer(path, device=device)
    cast = SentenceTransformer(path, device=device).to(half)

    def encode(st: Any, size: int) -> Any:
        return st.encode(texts, batch_size=size, normalize_embeddings=True, convert_to_numpy=True)

    def under_autocast(size: int) -> Any:
        with torch.autocast(device_type=device, dtype=half):
            return encode(fp32, size)

    return {"st-fp32@best": lambda size: encode(fp32, size), "st-autocast@best": under_autocast,
            "st-bf16@best": lambda size: encode(cast, size)}


def best_rate(run: Callable[[int], Any], sizes: list[int], n: int, sync: Callable[[], None]) -> tuple[float, int]:
    """The best sentences/s of `run` over `sizes` (in order), stopping after two sizes in a row without
    a gain; and the size it came at."""
    best, best_size, flat = 0.0, sizes[0], 0
    for size in sizes:
        sync()
        started = time.perf_counter()
        run(size)
        sync()
        rate = n / (time.perf_counter() - started)
        if rate > best:
            best, best_size, flat = rate, size, 0
        else:
            flat += 1
            if flat >= 2:
                break
    return best, best_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    parser.add_argument("--model", default=MODEL, help="model id or local folder")
    parser.add_argument("--precision", default="auto", choices=PRECISION_SETTINGS, help="the agent's (default auto)")
    parser.add_argument("--agent-batch-size", type=int, default=None, help="default: the agent's choice")
    parser.add_argument("--st-batch-size", type=int, default=32, help="plain arms (ST default 32)")
    parser.add_argument("--tuned-sizes", default="32,64,128,256,512,1024",
                        help="the batch sizes the tuned twins try, in order")
    parser.add_argument("--no-tuned", dest="tuned", action="store_false", help="without the tuned twins")
    args = parser.parse_args()

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    texts = sentences(args.sentences)
    records = [{"id": i, "text": t} for i, t in enumerate(texts)]
    runner = EmbeddingRunner(TorchSettings(device=args.device, threads=args.threads, precision=args.precision))
    sub = agent_subtask(args.model, len(records), args.agent_batch_size)
    loop = asyncio.new_event_loop()

    def run_agent() -> Any:
        return np.asarray([o["embedding"] for o in loop.run_until_complete(runner.run(sub, records))])

    arms: dict[str, Callable[[], Any]] = {"agent": run_agent, **plain_arms(args.model, args.device, texts,
                                                                           args.st_batch_size)}
    tuned = tuned_arms(args.model, args.device, texts) if args.tuned else {}
    sizes = [int(x) for x in args.tuned_sizes.split(",")]
    vectors = {name: np.asarray(fn(), dtype=np.float32) for name, fn in arms.items()}  # warm-up, and the vectors
    for name, run in tuned.items():
        vectors[name] = np.asarray(run(sizes[0]), dtype=np.float32)
    rates: dict[str, list[float]] = {name: [] for name in [*arms, *tuned]}
    best_sizes: dict[str, list[int]] = {name: [] for name in tuned}
    names = [*arms, *tuned]

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    for round_no in range(args.rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:  # rotate who goes first
            if name in tuned:
                rate, size = best_rate(tuned[name], sizes, len(texts), sync)
                rates[name].append(rate)
                best_sizes[name].append(size)
                continue
            sync()
            started = time.perf_counter()
            arms[name]()
            sync()
            rates[name].append(len(texts) / (time.perf_counter() - started))
    loop.run_until_complete(runner.aclose())
    loop.close()
    (choice,) = runner.precision_choices()
    agent_batch = args.agent_batch_size or (runner._loaded.batch_size if runner._loaded else None)

    reference = vectors["st-fp32"] / np.linalg.norm(vectors["st-fp32"], axis=1, keepdims=True)
    cosines = {}
    for name, got in vectors.items():
        got = got / np.linalg.norm(got, axis=1, keepdims=True)
        row = np.sum(got * reference, axis=1)
        cosines[name] = (float(row.min()), float(row.mean()))
    median = {name: statistics.median(values) for name, values in rates.items()}
    fastest = max((name for name in names if name != "agent"), key=lambda name: median[name])
    ratio = median["agent"] / median[fastest]
    print(
        f"{len(texts)} sentences, {args.threads} threads, device {args.device}, median of {args.rounds} "
        f"alternating rounds; plain arms: sentence-transformers, batch {args.st_batch_size}; agent: "
        f"{choice.precision} (weights {choice.weights}, {choice.setting}; probe cosine {choice.cosine:.6f}), "
        f"batch {agent_batch}"
    )
    for name in names:
        low, mean = cosines[name]
        at = f"   (best batch per round: {best_sizes[name]})" if name in best_sizes else ""
        print(f"  {name:17s} {median[name]:8.1f} sentences/s   cosine to st-fp32 min {low:.6f} mean {mean:.7f}"
              f"   (rounds: {', '.join(f'{r:.0f}' for r in rates[name])}){at}")
    print(f"  agent / fastest plain ({fastest}) = {ratio:.3f}")
    batch = "its best batch" if fastest in best_sizes else f"batch {args.st_batch_size}"
    limits.report(limits.Ratio("bench/embed_agent.py", f"{len(texts)} sentences, device {args.device}, the agent's "
                               "runner", f"the fastest plain script ({fastest}, {batch})", ratio,
                               1.0, at_least=True, machine=machine.describe()))
    print(json.dumps({
        "median_sentences_per_s": {k: round(v, 1) for k, v in median.items()},
        "agent_over_fastest_plain": round(ratio, 3),
        "fastest_plain": fastest,
        "precision": choice.precision,
        "weights": choice.weights,
        "agent_batch_size": agent_batch,
        "tuned_best_batch_sizes": best_sizes,
        "min_cosine_to_st_fp32": {k: round(v[0], 7) for k, v in cosines.items()},
    }))


if __name__ == "__main__":
    main()
