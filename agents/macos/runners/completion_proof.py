"""Proofs of generation for completions, after TOPLOC (Ong et al., ICML 2025): checking a completion
costs one prefill pass instead of generating it again, and holds across hardware and kernels.

While it generates, the executor keeps the final hidden state that produced each new token (the
input of the LM head, caught by a forward pre-hook) and commits, every PROOF_EVERY tokens and at the
last one, the PROOF_TOP_K largest-magnitude coordinates of that state: their indices and values,
with the generated token ids. A verifier with the same model runs the prompt and those tokens
through the model once and checks, at each committed position:
- the state's own top-k indices overlap the committed ones (MIN_OVERLAP), and its values at the
  committed indices are close (MAX_VALUE_ERROR of their mean magnitude): bf16 against fp32, another
  GPU or another kernel order stay well inside; another model, prompt or text does not;
- the committed tokens are what the logits allow: under greedy decoding the argmax at (almost,
  MIN_GREEDY) every position; sampled at temperature T, a token of probability at least
  MIN_SAMPLED_P under softmax(logits / T) at (almost, MIN_SAMPLED) every position (a text made up
  and run through the model has tokens the model finds all but impossible);
- the text is the tokens' decoding, and the usage counts are theirs.
Where TOPLOC encodes the values as a polynomial to make the proof small (258 bytes per 32 tokens),
this keeps them as numbers (about 200 bytes per 32 tokens in JSON, with the token ids beside them):
the same check, not the same encoding. It proves that the text was processed by the model the task
pins and is a decoding the model allows; not that it came from this exact random stream.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

PROOF_VERSION = 1
PROOF_EVERY = 32
PROOF_TOP_K = 8
MIN_OVERLAP = 0.5  # of the committed indices among the verifier's own top-k, per position
MAX_VALUE_ERROR = 0.1  # mean absolute error at the committed indices over their mean magnitude
MIN_GREEDY = 0.9  # share of tokens that are the verifier's argmax under greedy decoding
MIN_SAMPLED_P = 1e-4  # a sampled token's least probability at the task's temperature
MIN_SAMPLED = 0.95  # share of sampled tokens that have it


def proof_positions(count: int) -> list[int]:
    """The generated positions a proof commits: every PROOF_EVERY-th and the last."""
    positions = list(range(PROOF_EVERY - 1, count, PROOF_EVERY))
    if count and (not positions or positions[-1] != count - 1):
        positions.append(count - 1)
    return positions


def _top(torch: Any, state: Any) -> tuple[list[int], list[float]]:
    values = state.float()
    idx = torch.topk(values.abs(), min(PROOF_TOP_K, values.shape[-1])).indices
    return [int(i) for i in idx.tolist()], [float(f"{float(v):.5g}") for v in values[idx].tolist()]


class StepTops:
    """While `generate` runs (a forward pre-hook on the model's LM head): each decoding step's top
    PROOF_TOP_K coordinates of the final hidden state of every row, kept on the device ([batch, k]
    indices and values per step, not the states: a few bytes a row a step)."""

    def __init__(self, torch: Any, model: Any) -> None:
        self._torch, self._head = torch, model.get_output_embeddings()
        self.steps: list[tuple[Any, Any]] = []
        self._handle: Any = None

    def __enter__(self) -> StepTops:
        if self._head is None:  # no LM head module to hook: plain generation, no proofs
            return self

        def keep(_module: Any, args: tuple[Any, ...]) -> None:
            state = args[0][:, -1, :].detach().float()
            idx = self._torch.topk(state.abs(), min(PROOF_TOP_K, state.shape[-1]), dim=-1).indices
            self.steps.append((idx, state.gather(-1, idx)))

        self._handle = self._head.register_forward_pre_hook(keep)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._handle is not None:
            self._handle.remove()

    def proof(self, row: int, tokens: Sequence[int]) -> dict[str, Any]:
        """The proof of row `row`'s generated `tokens` (end of sequence included): step j made token j."""
        steps = []
        for position in proof_positions(len(tokens)):
            idx, values = self.steps[position]
            steps.append([position, [int(i) for i in idx[row].tolist()],
                          [float(f"{float(v):.5g}") for v in values[row].tolist()]])
        return {"v": PROOF_VERSION, "tokens": list(tokens), "steps": steps}


@contextlib.contextmanager
def final_states(model: Any) -> Iterator[list[Any]]:
    """Every input of the model's LM head while the block runs ([batch, length, hidden] per call)."""
    caught: list[Any] = []
    head = model.get_output_embeddings()

    def keep(_module: Any, args: tuple[Any, ...]) -> None:
        caught.append(args[0].detach())

    handle = head.register_forward_pre_hook(keep)
    try:
        yield caught
    finally:
        handle.remove()


def check_proof(torch: Any, model: Any, prompt: Sequence[int], record: dict[str, Any], decode: Any,
                temperature: float, max_tokens: int, eos: set[int]) -> str | None:
    """Why `record` (`text`, `usage`, `proof`) is not what the model generated from `prompt` under
    `temperature` and `max_tokens`; None when it holds. One prefill pass over prompt and tokens (at
    most max_tokens), on the caller's thread. Anything malformed is a reason, never an exception."""
    try:
        return _check(torch, model, prompt, record, decode, temperature, max_tokens, eos)
    except Exception as exc:  # a crafted proof must not crash the checker: it is refused
        return f"the proof cannot be checked ({type(exc).__name__})"


def _check(torch: Any, model: Any, prompt: Sequence[int], record: dict[str, Any], decode: Any,
           temperature: float, max_tokens: int, eos: set[int]) -> str | None:
    proof = record.get("proof")
    if not isinstance(proof, dict) or proof.get("v") != PROOF_VERSION:
        return "no proof of generation"
    tokens, steps = proof.get("tokens"), proof.get("steps")
    head = model.get_output_embeddings()
    vocab = head.weight.shape[0] if head is not None else 0
    if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < vocab for t in tokens):
        return "the proof's tokens are not token ids of the model"
    # What generation hands in: at least one token, and it stops at the first end of sequence or at
    # max_tokens, nowhere else (a result cut short would prove little for little work).
    if not tokens or len(tokens) > max_tokens:
        return f"{len(tokens)} tokens: a generation makes 1 to {max_tokens}"
    if any(t in eos for t in tokens[:-1]) or (tokens[-1] not in eos and len(tokens) != max_tokens):
        return "the tokens do not end where generation ends (end of sequence, or max_tokens)"
    if not isinstance(steps, list) or not all(isinstance(s, list) and len(s) == 3 for s in steps) \
            or [s[0] for s in steps] != proof_positions(len(tokens)) \
            or any(type(s[0]) is not int for s in steps):
        return "the proof does not commit the positions it must"
    usage = record.get("usage") or {}
    if usage.get("completion_tokens", len(tokens)) != len(tokens) or usage.get("prompt_tokens", len(prompt)) \
            != len(prompt):
        return "the usage counts are not the proof's"
    if decode(tokens) != record.get("text"):
        return "the text is not the decoding of the proof's tokens"
    states, logits = _prefill(torch, model, list(prompt), list(tokens))
    width = states.shape[-1]
    k = min(PROOF_TOP_K, width)
    for position, indices, values in steps:
        if not (isinstance(indices, list) and isinstance(values, list) and len(indices) == k == len(values)
                and len(set(indices)) == k and all(type(i) is int and 0 <= i < width for i in indices)
                and all(type(v) in (int, float) and math.isfinite(v) for v in values)):
            return f"position {position}: malformed proof step"
        state = states[position].float()
        own, _ = _top(torch, state)
        if len(set(own) & set(indices)) < MIN_OVERLAP * k:
            return f"position {position}: the hidden state's largest coordinates are not the proof's"
        committed = torch.tensor([float(v) for v in values])
        recomputed = state[torch.tensor(indices, dtype=torch.long, device=state.device)].cpu()
        scale = float(committed.abs().mean()) or 1.0
        if float((recomputed - committed).abs().mean()) > MAX_VALUE_ERROR * scale:
            return f"position {position}: the hidden state's values are not the proof's"
    wanted = torch.tensor(tokens, device=logits.device)
    if temperature <= 0:
        share = float((logits.argmax(dim=-1) == wanted).float().mean())
        if share < MIN_GREEDY:
            return f"only {share:.0%} of the tokens are the model's greedy choice"
    else:
        chance = torch.softmax(logits.float() / temperature, dim=-1).gather(-1, wanted[:, None])
        share = float((chance >= MIN_SAMPLED_P).float().mean())
        if share < MIN_SAMPLED:
            return f"only {share:.0%} of the tokens are likely enough at temperature {temperature:g}"
    return None


def _prefill(torch: Any, model: Any, prompt: list[int], tokens: list[int]) -> tuple[Any, Any]:
    """One forward pass over prompt and tokens: at each generated position j, the final hidden state
    that produced token j (the LM head's input at the position before it) and the logits there
    ([len(tokens), hidden], [len(tokens), vocab]): logits for those positions only, never the
    prompt's (a long prompt times a large vocabulary is gigabytes)."""
    import inspect

    ids = torch.tensor([prompt + tokens[:-1]], device=model.device)  # the last token produces nothing
    keep = {"logits_to_keep": len(tokens)} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with final_states(model) as caught:
        logits = model(input_ids=ids, **keep).logits[0]
    return caught[-1][0][-len(tokens):], logits[-len(tokens):]
