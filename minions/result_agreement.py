"""Whether two results of the same records say the same: what a spot check's vote (the API) and
`minions verify` (the CLI) both decide, with one rule.

Per record, by kind: embedding, the vectors' cosine is at least `min_cosine` (bf16 and fp16 against
fp32 stay above 0.9999 for the models served); completion, the texts' similarity is at least
`min_similarity` (difflib's ratio: only greedy completions are compared, and greedy decoding on other
hardware or kernels may still part after a few tokens, where a lie differs from the first); sleep,
nothing beyond the id. Both results passed the shape check at their complete (output_check.py), so
each is an object with `id` and its kind's field; anything else disagrees.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

import orjson


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine of two vectors; -2.0 when their lengths differ (no cosine is that low)."""
    if len(a) != len(b):
        return -2.0
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(math.fsum(x * x for x in a))
    nb = math.sqrt(math.fsum(y * y for y in b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return dot / (na * nb)


def text_similarity(a: object, b: object) -> float:
    """1.0 for equal texts, difflib's ratio for two strings, 0.0 when either is not a string."""
    if a == b:
        return 1.0
    if not isinstance(a, str) or not isinstance(b, str):
        return 0.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def record_score(kind: str, mine: dict[str, Any], theirs: dict[str, Any]) -> float:
    """How alike two results of one record are: a cosine (embedding), a similarity (completion), or 1.0
    (sleep, or the same error)."""
    if kind == "embedding":
        a, b = mine.get("embedding"), theirs.get("embedding")
        if not isinstance(a, list) or not isinstance(b, list):
            return 1.0 if a == b else -2.0
        return cosine(a, b)
    if kind == "completion":
        return text_similarity(mine.get("text"), theirs.get("text"))
    return 1.0


def records_agree(kind: str, mine: dict[str, Any], theirs: dict[str, Any], min_cosine: float,
                  min_similarity: float) -> bool:
    """Whether two results of one record agree (see the module's docstring)."""
    if mine.get("id") != theirs.get("id"):
        return False
    score = record_score(kind, mine, theirs)
    return score >= (min_cosine if kind == "embedding" else min_similarity if kind == "completion" else 1.0)


def outputs_agree(kind: str, mine: bytes, theirs: bytes, min_cosine: float, min_similarity: float = 1.0) -> bool:
    """Whether two JSONL outputs of one subtask agree: the same ids in the same order, each record's
    results agreeing."""
    try:
        a = [orjson.loads(line) for line in mine.splitlines() if line.strip()]
        b = [orjson.loads(line) for line in theirs.splitlines() if line.strip()]
    except orjson.JSONDecodeError:
        return False
    if len(a) != len(b):
        return False
    return all(isinstance(x, dict) and isinstance(y, dict) and records_agree(kind, x, y, min_cosine, min_similarity)
               for x, y in zip(a, b, strict=True))
