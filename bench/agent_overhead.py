"""What the agent spends per sentence outside the model's forward, against an older revision's agent,
and what the API spends per 1,000 committed vectors. Runs on any machine (no GPU needed): the forward
is the one thing left out.

Agent arms, each a fresh process of its revision's EmbeddingRunner (this tree's, and `--from REV`'s
in a temporary worktree: bench/revision.py), alternating round by round (the machine is shared and
noisy, so only side-by-side numbers compare): `runner.run` on a subtask of `--sentences` sentences
with the model's forward replaced by a stub that returns zeros of the forward's output shape
(batch, tokens, 384), then the output lines as the agent writes them (jsoncodec.dumps_line). What is
timed is everything the agent does around the forward: tokenizing, building the input tensors,
pooling, copies back, the output's encoding. The batch size is fixed (`--batch-size`, the probe and
sizing at load are skipped) so that both revisions cut the same batches. Printed: microseconds per
sentence per arm (median of the rounds, and every round) and the ratio this tree / REV.

API: OutputCheck (services/api/leasing/output_check.py, what complete runs on every output) over the
output of 1,000 embeddings of 384 floats, in this process: CPU milliseconds per 1,000 committed
vectors (median of the rounds).

    python bench/agent_overhead.py [--sentences 2000] [--rounds 5] [--batch-size 64] [--threads 2]
                                   [--from 9db6083^]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import limits, machine, revision  # noqa: E402

# Before the agent's tokenization moved off the device's critical path (agents/macos/runners/token_batches.py).
DEFAULT_FROM = "9db6083^"

# Run inside a tree (its own `minions` package on the path): one round, printed as µs per sentence.
ROUND = r"""
import asyncio, json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sentences, batch_size, threads, repeats = (int(x) for x in sys.argv[1:5])
import torch
from minions import jsoncodec
from minions.agents.macos.protocol import InputRef, OutputRef, Subtask
from minions.agents.macos.runners import batch_sizing, precision
from minions.agents.macos.runners.embedding import EmbeddingRunner
from minions.agents.macos.runners.torch_setup import TorchSettings
from bench.embed_agent import MODEL, sentences as make_sentences

# Load without the probes (fp32, the given batch size): only the run is timed.
batch_sizing.choose = lambda *a, **k: batch_sizing.Sizing(batch_size, {}, "bench: fixed")

class Stub(torch.nn.Module):
    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **_):
        return (torch.zeros(input_ids.shape[0], input_ids.shape[1], 384),)

runner = EmbeddingRunner(TorchSettings(device="cpu", threads=threads, precision="fp32"))
loop = asyncio.new_event_loop()
loop.run_until_complete(runner.prepare(MODEL))
runner._loaded.precise.model = Stub()
texts = make_sentences(sentences)
records = [{"id": i, "text": t} for i, t in enumerate(texts)]
sub = Subtask(team="b", project="b", task_name="b", subtask_id=0, attempt=1, kind="embedding", model=MODEL,
              params={"batch_size": batch_size}, input=InputRef(url="", range=[0, 0], records=len(records)),
              output=OutputRef(url=""))

def once():
    out = loop.run_until_complete(runner.run(sub, records))
    return b"".join(jsoncodec.dumps_line(o) for o in out)

once()  # warm-up
best = []
for _ in range(repeats):
    started = time.perf_counter()
    once()
    best.append((time.perf_counter() - started) / len(records) * 1e6)
print(json.dumps(min(best)))
"""


def agent_round(tree: Path, args: argparse.Namespace) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)}
    out = subprocess.run([sys.executable, "-c", ROUND, str(args.sentences), str(args.batch_size), str(args.threads),
                          "3"], cwd=tree, env=env, capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise SystemExit(f"round in {tree} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def api_ms_per_thousand(rounds: int) -> float:
    """OutputCheck over 1,000 embedding lines of 384 floats: CPU ms, median of the rounds."""
    import random

    from minions import jsoncodec
    from minions.services.api.leasing.output_check import OutputCheck

    rng = random.Random(0)
    inputs = b"".join(jsoncodec.dumps_line({"id": i, "text": "x"}) for i in range(1000))
    output = b"".join(jsoncodec.dumps_line({"id": i, "embedding": [rng.uniform(-1, 1) for _ in range(384)]})
                      for i in range(1000))
    times = []
    for _ in range(rounds):
        started = time.process_time()
        check = OutputCheck(1000, "embedding")
        check.add_input(inputs)
        check.add_output(output)
        check.finish()
        times.append((time.process_time() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--from", dest="rev", default=DEFAULT_FROM, help="the older agent's revision")
    args = parser.parse_args()
    print(f"# bench/agent_overhead.py on {machine.describe()}")
    print(f"# {args.sentences} sentences, batch {args.batch_size}, {args.threads} threads, forward stubbed; "
          f"REV = {revision.describe(args.rev)}")
    times: dict[str, list[float]] = {"head": [], "rev": []}
    with revision.checkout(args.rev) as old:
        for index in range(args.rounds):
            order = [("head", ROOT), ("rev", old)]
            for name, tree in order if index % 2 == 0 else reversed(order):
                times[name].append(agent_round(tree, args))
            print(f"round {index + 1}: head {times['head'][-1]:.1f} us/sentence, rev {times['rev'][-1]:.1f}",
                  flush=True)
    head, rev = statistics.median(times["head"]), statistics.median(times["rev"])
    print(json.dumps({"agent_us_per_sentence": {"head": round(head, 2), "rev": round(rev, 2)},
                      "rounds": times, "ratio_head_to_rev": round(head / rev, 3)}))
    api = api_ms_per_thousand(args.rounds)
    print(json.dumps({"api_cpu_ms_per_1000_vectors": round(api, 2), "path": "JSON lines (OutputCheck)"}))
    limits.report(limits.Ratio(bench="bench/agent_overhead.py",
                               figure=f"{args.sentences} sentences, forward stubbed: agent us/sentence",
                               limit=f"the agent at {args.rev}", ratio=head / rev, target=0.25, at_least=False,
                               machine=machine.describe()))


if __name__ == "__main__":
    main()
