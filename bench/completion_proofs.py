"""What proofs of generation cost (agents/macos/runners/completion_proof.py), on this machine's CPU.

Two figures, each the median of alternating rounds in one process (the machine is shared and noisy:
only side-by-side numbers compare), against plain transformers measured beside them:

- making:    `generate` as the agent runs it (the LM-head hook keeping each step's top-k, and the
             proofs built) against the same `generate` with no hook: the overhead on every completion;
- checking:  a replica verifying the proofs (TransformersCompletionRunner.verify: one prefill pass per
             record) against generating the same records again (what replication costs).

The model is a random-weight Llama of a size a CPU can time in seconds (`--hidden`, `--layers`;
a real model's weights change nothing in what is computed), the tokenizer the tests' tiny one
(minions/testing/tiny_lm.py).

    python bench/completion_proofs.py [--records 16] [--tokens 64] [--rounds 5] [--hidden 512 --layers 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.progress import Progress

from bench.machine import cpu_model
from minions.agents.macos.runners.completion import CompletionParams
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner
from minions.jsoncodec import dumps_str


def _model(folder: Path, hidden: int, layers: int) -> Path:
    """The tests' tokenizer with a bigger random Llama."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from minions.testing import tiny_lm

    tiny_lm.build(folder)
    config = LlamaConfig.from_pretrained(folder)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = hidden, 4 * hidden, layers
    config.num_attention_heads, config.num_key_value_heads = max(4, hidden // 64), max(2, hidden // 128)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per record")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import torch

    with tempfile.TemporaryDirectory() as tmp:
        model = str(_model(Path(tmp) / "lm", args.hidden, args.layers))
        runner = TransformersCompletionRunner(TorchSettings(device="cpu", threads=args.threads, precision="fp32"))
        records: list[dict[str, Any]] = [{"id": i, "prompt": f"the machine number {i} embeds the queue while"}
                                         for i in range(args.records)]
        params = CompletionParams(temperature=0.8, max_tokens=args.tokens, seed=1)
        # min_new_tokens: every record generates `--tokens`, so both arms do the same work
        loaded = runner._load(model)
        loaded.model.generation_config.min_new_tokens = args.tokens
        plain: list[float] = []
        proved: list[float] = []
        verify: list[float] = []
        regenerate: list[float] = []
        with Progress() as progress:
            bar = progress.add_task("rounds", total=args.rounds)
            for _ in range(args.rounds):
                start = time.perf_counter()
                made = runner.generate(model, records, params)
                proved.append(time.perf_counter() - start)
                start = time.perf_counter()
                with torch.inference_mode():
                    prompts = [runner._prompt_ids(loaded.tokenizer, r, params) for r in records]
                    width = max(map(len, prompts))
                    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
                    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
                    torch.manual_seed(1)
                    loaded.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.tokens,
                                          do_sample=True, temperature=0.8, pad_token_id=0)
                plain.append(time.perf_counter() - start)
                start = time.perf_counter()
                checked = runner.verify(model, records, params, [made])
                verify.append(time.perf_counter() - start)
                assert checked == made, "an honest proof did not hold"
                start = time.perf_counter()
                runner.generate(model, records, params)
                regenerate.append(time.perf_counter() - start)
                progress.advance(bar)
    name = cpu_model()
    size = sum(len(dumps_str(line["proof"])) for line in made) / sum(len(line["proof"]["tokens"]) for line in made)
    median = statistics.median
    print(f"command: python bench/completion_proofs.py --records {args.records} --tokens {args.tokens} "
          f"--rounds {args.rounds} --hidden {args.hidden} --layers {args.layers} --threads {args.threads}")
    print(f"machine: {name}; torch threads {args.threads}; Llama hidden {args.hidden}, {args.layers} layers, "
          f"{args.records} records x {args.tokens} tokens, sampled; median of {args.rounds} rounds")
    print(f"making:   generate with proofs {median(proved):.3f} s, plain generate {median(plain):.3f} s: "
          f"x{median(proved) / median(plain):.3f}")
    print(f"checking: verify (prefill) {median(verify):.3f} s, generate again {median(regenerate):.3f} s: "
          f"x{median(verify) / median(regenerate):.3f} ({median(regenerate) / median(verify):.1f} times cheaper)")
    print(f"proof size: {size:.1f} bytes of JSON per generated token (token ids included)")


if __name__ == "__main__":
    main()
