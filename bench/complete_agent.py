"""Completion throughput: the agent's transformers runner against one-at-a-time `generate`.

Builds a random-weight Llama-style causal LM (about 3.5 M parameters, byte-level BPE tokenizer
trained on the spot, nothing downloaded), then generates greedily for the same records with
(a) the agent's TransformersCompletionRunner (length-grouped, left-padded batches) and (b) plain
transformers, one `generate` call per record, as a straightforward script would. Both run fp32 on
the same device and threads. The arms alternate within each round (the machine is shared and
noisy, so only side-by-side numbers compare); each figure is the median of the rounds. Every
round checks that both arms produced the same texts.

    python bench/complete_agent.py [--records 64] [--max-tokens 32] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from minions.agents.macos.protocol import InputRef, OutputRef, Subtask
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import (
    DEFAULT_BATCH_SIZE,
    TransformersCompletionRunner,
    build_prompt,
)

_WORDS = (
    "idle laptops embed documents overnight while owners sleep the queue hands each executor a lease "
    "heartbeats keep it alive results land in object storage exactly once apple silicon shares memory "
    "why how what when where does should a an of to in on for"
).split()


def prompts(n: int, seed: int = 0) -> list[str]:
    """Questions of 5 to 60 words, varied as real prompts are."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 60))).capitalize() + "?" for _ in range(n)]


def build_model(folder: Path, hidden: int, layers: int) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(prompts(2000, seed=1), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=hidden,
        intermediate_size=hidden * 8 // 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    print(
        f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters, "
        f"hidden {hidden}, {layers} layers, vocab {len(fast)}"
    )
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


class OneAtATime:
    """Plain transformers: one greedy `generate` per record."""

    def __init__(self, folder: Path, device: str) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device
        self.tokenizer: Any = AutoTokenizer.from_pretrained(folder)
        self.model: Any = AutoModelForCausalLM.from_pretrained(folder).float().to(device).eval()

    def run(self, records: list[dict[str, Any]], max_tokens: int) -> list[str]:
        import torch

        eos = self.model.generation_config.eos_token_id
        texts = []
        with torch.inference_mode():
            for record in records:
                text, special = build_prompt(self.tokenizer, record, None)
                encoded = self.tokenizer(text, return_tensors="pt", add_special_tokens=special).to(self.device)
                out = self.model.generate(
                    **encoded, max_new_tokens=max_tokens, do_sample=False, pad_token_id=self.tokenizer.pad_token_id
                )
                new = out[0, encoded["input_ids"].shape[1] :].tolist()
                new = new[: new.index(eos) + 1] if eos in new else new
                texts.append(self.tokenizer.decode(new, skip_special_tokens=True))
        return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=None, help="default: the agent's default for the device")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "mps"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    records = [{"id": i, "prompt": p} for i, p in enumerate(prompts(args.records))]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_model(Path(tmp), args.hidden, args.layers)
        settings = TorchSettings(
            device=args.device, threads=args.threads, precision="fp32", generation_batch_size=args.batch_size
        )
        runner = TransformersCompletionRunner(settings)
        plain = OneAtATime(folder, args.device)
        sub = Subtask(
            team="bench",
            project="bench",
            task_name="complete",
            subtask_id=0,
            attempt=1,
            kind="completion",
            model=str(folder),
            params={"temperature": 0, "max_tokens": args.max_tokens},
            input=InputRef(url="", range=[0, 0], records=len(records)),
            output=OutputRef(url=""),
        )
        loop = asyncio.new_event_loop()

        def run_agent() -> list[str]:
            return [o["text"] for o in loop.run_until_complete(runner.run(sub, records))]

        arms = {"agent": run_agent, "one-at-a-time": lambda: plain.run(records, args.max_tokens)}
        names = list(arms)
        run_agent()  # warm-up: load the model
        rates: dict[str, list[float]] = {name: [] for name in arms}
        for round_no in range(args.rounds):
            texts = {}
            for name in names[round_no % 2 :] + names[: round_no % 2]:  # alternate who goes first
                if args.device == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                texts[name] = arms[name]()
                rates[name].append(len(records) / (time.perf_counter() - started))
            if texts["agent"] != texts["one-at-a-time"]:
                raise SystemExit(f"round {round_no}: the outputs differ")
        loop.run_until_complete(runner.aclose())
        loop.close()

    median = {name: statistics.median(values) for name, values in rates.items()}
    batch = args.batch_size or DEFAULT_BATCH_SIZE.get(args.device, 8)
    print(
        f"{len(records)} records, {args.max_tokens} new tokens each, greedy, batch {batch}, {args.threads} threads, "
        f"device {args.device}, median of {args.rounds} alternating rounds; outputs equal in every round"
    )
    for name in names:
        print(f"  {name:14s} {median[name]:8.2f} records/s   (rounds: {', '.join(f'{r:.2f}' for r in rates[name])})")
    print(f"  agent / one-at-a-time = {median['agent'] / median['one-at-a-time']:.2f}   (target >= 3)")
    print(json.dumps({"median_records_per_s": {k: round(v, 2) for k, v in median.items()}}))


if __name__ == "__main__":
    main()
