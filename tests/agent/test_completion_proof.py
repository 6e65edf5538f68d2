"""Proofs of generation (completion_proof.py) on the tiny LM: an honest result's proof holds when
another runner checks it (one prefill pass, no generation), greedy and sampled, in fp32 and bf16;
a changed text, changed tokens, made-up values, another model or another prompt do not, and the
checking runner then answers its own result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from minions.agents.macos.runners.completion import CompletionParams
from minions.agents.macos.runners.completion_proof import PROOF_EVERY, proof_positions
from minions.agents.macos.runners.torch_setup import TorchSettings
from minions.agents.macos.runners.transformers_completion import TransformersCompletionRunner
from minions.testing import tiny_lm
from tests.agent.factories import subtask

RECORDS: list[dict[str, Any]] = [{"id": i, "prompt": p} for i, p in enumerate(
    ["The machine embeds", "Why is the queue", "A laptop sleeps while", "Heartbeat token lease"])]


def _jsonl(lines: list[dict[str, Any]]) -> str:
    return "".join(orjson.dumps(line).decode() + "\n" for line in lines)


@pytest.fixture(scope="module")
def runner() -> TransformersCompletionRunner:
    return TransformersCompletionRunner(TorchSettings(device="cpu", threads=2, precision="fp32"))


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tiny_lm.build(tmp_path_factory.mktemp("other-lm"), seed=1))


def test_proof_positions() -> None:
    assert proof_positions(0) == []
    assert proof_positions(5) == [4]
    assert proof_positions(PROOF_EVERY) == [PROOF_EVERY - 1]
    assert proof_positions(70) == [31, 63, 69]


@pytest.mark.parametrize("params", [{"temperature": 0, "max_tokens": 70}, {"temperature": 0.9, "max_tokens": 40,
                                                                            "seed": 3}])
async def test_an_honest_proof_holds_and_a_check_echoes_it(runner: TransformersCompletionRunner,
                                                           tiny_lm_dirs: dict[str, Path],
                                                           params: dict[str, Any]) -> None:
    model = str(tiny_lm_dirs["plain"])
    made = await runner.run(subtask("completion", model, params, len(RECORDS)), RECORDS)
    assert all(len(line["proof"]["tokens"]) == line["usage"]["completion_tokens"] for line in made)
    assert all(len(line["proof"]["steps"]) == len(proof_positions(len(line["proof"]["tokens"]))) for line in made)
    # Checked in bf16 on another runner: the same lines come back, nothing generated.
    checker = TransformersCompletionRunner(TorchSettings(device="cpu", threads=2, precision="bf16"))
    checked = await checker.run(subtask("completion", model, params, len(RECORDS), check=[_jsonl(made)]), RECORDS)
    assert checked == made


async def test_a_forged_result_fails_its_proof(runner: TransformersCompletionRunner, tiny_lm_dirs: dict[str, Path],
                                               other_model: str) -> None:
    model = str(tiny_lm_dirs["plain"])
    params = {"temperature": 0, "max_tokens": 40}
    made = await runner.run(subtask("completion", model, params, len(RECORDS)), RECORDS)
    foreign = await runner.run(subtask("completion", other_model, params, len(RECORDS)), RECORDS)
    tokenizer = runner._loaded.tokenizer if runner._loaded else None  # the other model's tokenizer is the same
    assert tokenizer is not None
    forged = [
        {**made[0], "text": made[0]["text"] + " and more"},  # text not the tokens' decoding
        {**made[1], "proof": {**made[1]["proof"], "steps": [[p, i, [v * 3 for v in vs]]
                                                             for p, i, vs in made[1]["proof"]["steps"]]}},
        foreign[2],  # another model's result, proof and all
        made[0] | {"id": 3},  # another record's result
    ]
    checked = await runner.run(subtask("completion", model, params, len(RECORDS), check=[_jsonl(forged)]), RECORDS)
    # None of the forged lines is echoed: each record is generated here, equal to the honest result
    # (greedy), proof included.
    assert [c["text"] for c in checked] == [m["text"] for m in made]
    assert all(c != f for c, f in zip(checked, forged, strict=True))
    # A second held result whose proofs hold wins where the first fails.
    checked = await runner.run(subtask("completion", model, params, len(RECORDS),
                                       check=[_jsonl(forged), _jsonl(made)]), RECORDS)
    assert checked == made


async def test_changed_tokens_decoded_again_fail_the_greedy_check(runner: TransformersCompletionRunner,
                                                                 tiny_lm_dirs: dict[str, Path]) -> None:
    """A liar that picks its own tokens and computes their real hidden states passes the state checks
    but not the decoding rule: greedy tokens must be the model's argmax."""
    model = str(tiny_lm_dirs["plain"])
    params = {"temperature": 0, "max_tokens": 24}
    made = await runner.run(subtask("completion", model, params, 1), RECORDS[:1])
    sampled = await runner.run(subtask("completion", model, {"temperature": 5.0, "max_tokens": 24, "seed": 1}, 1),
                               RECORDS[:1])
    assert sampled[0]["text"] != made[0]["text"]
    # The sampled line's proof is honest for its tokens, but they are not greedy.
    checked = await runner.run(subtask("completion", model, params, 1, check=[_jsonl(sampled)]), RECORDS[:1])
    assert checked == made


async def test_crafted_proofs_are_refused_not_crashed_on(runner: TransformersCompletionRunner,
                                                         tiny_lm_dirs: dict[str, Path]) -> None:
    """What a liar might send instead of work: an empty completion, one cut short (a single forward
    pass would prove it), steps of the wrong form, ids beyond any vocabulary, more tokens than the
    task allows. Each is refused (the record generated here), none crashes the checking runner."""
    import torch

    from minions.agents.macos.runners.completion_proof import check_proof

    model = str(tiny_lm_dirs["plain"])
    params = {"temperature": 0, "max_tokens": 24}
    [made] = await runner.run(subtask("completion", model, params, 1), RECORDS[:1])
    loaded = runner._loaded
    assert loaded is not None
    prompt = runner._prompt_ids(loaded.tokenizer, RECORDS[0], CompletionParams.parse(params))

    def why(line: dict[str, Any], max_tokens: int = 24) -> str | None:
        return check_proof(torch, loaded.model, prompt, line, lambda t: loaded.tokenizer.decode(
            t, skip_special_tokens=True), 0.0, max_tokens, {loaded.model.generation_config.eos_token_id})

    assert why(made) is None
    proof, tokens = made["proof"], made["proof"]["tokens"]
    empty = {**made, "text": "", "usage": {**made["usage"], "completion_tokens": 0},
             "proof": {"v": 1, "tokens": [], "steps": []}}
    assert "a generation makes 1 to 24" in (why(empty) or "")
    if tokens[-1] != loaded.model.generation_config.eos_token_id:
        short = tokens[:1]
        cut = {**made, "text": loaded.tokenizer.decode(short, skip_special_tokens=True),
               "usage": {**made["usage"], "completion_tokens": 1},
               "proof": {"v": 1, "tokens": short, "steps": [[0, *proof["steps"][0][1:]]]}}
        assert "do not end where generation ends" in (why(cut) or "")
    assert why(made, max_tokens=len(tokens) - 1) is not None  # more than the task allows
    steps = proof["steps"]
    for crafted in ([[float(p), i, v] for p, i, v in steps], [[p, [], []] for p, _, _ in steps],
                    [[p, i] for p, i, _ in steps], [[p, i, [float("nan")] * len(v)] for p, i, v in steps],
                    [[p, [i[0]] * len(i), v] for p, i, v in steps], "not a list"):
        assert why({**made, "proof": {**proof, "steps": crafted}}) is not None, crafted
    assert "not token ids" in (why({**made, "proof": {**proof, "tokens": [2**40, *tokens[1:]]}}) or "")
    # Through the runner: refused lines are generated here, the honest result comes back.
    forged = {**made, "proof": {**proof, "steps": [[float(p), i, v] for p, i, v in steps]}}
    checked = await runner.run(subtask("completion", model, params, 1, check=[_jsonl([forged])]), RECORDS[:1])
    assert checked == [made]


async def test_the_runner_reports_the_proofs_it_makes(runner: TransformersCompletionRunner,
                                                      tiny_lm_dirs: dict[str, Path]) -> None:
    model = str(tiny_lm_dirs["plain"])
    [report] = await runner.fingerprints([model])
    assert report["proofs"] == 1 and report["backend"] == "transformers"
