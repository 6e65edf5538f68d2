"""A deterministic sample of varied English sentences, for `make run` and benchmarks."""

from __future__ import annotations

import random

_SUBJECTS = ["The old lighthouse keeper", "A curious fox", "Our quarterly revenue", "The new database index",
             "A sudden summer storm", "The orchestra's second violinist", "An idle MacBook in the office",
             "The search ranking model", "A tired night-shift nurse", "The mountain railway",
             "This embedding pipeline", "A stray satellite", "The city council", "My grandmother's recipe",
             "The compiler's optimiser", "A flock of migrating geese"]
_VERBS = ["quietly rebuilt", "carefully measured", "unexpectedly doubled", "slowly forgot", "happily explained",
          "completely rewrote", "briefly paused", "accidentally deleted", "patiently translated",
          "proudly presented", "barely survived", "silently watched"]
_OBJECTS = ["the harbour charts", "a thousand customer reviews", "the winter schedule", "its own benchmark",
            "the broken espresso machine", "every cached model", "the museum's oldest map",
            "a list of overdue invoices", "the lecture on thermodynamics", "the missing puzzle piece",
            "the failing integration test", "a bowl of ripe cherries"]
_TAILS = ["before dawn.", "during the long weekend.", "while nobody was looking.", "without any warning.",
          "for the third time this year.", "after the power came back.", "in under a second.",
          "as the deadline approached.", "on a borrowed laptop.", "with remarkable precision."]


def sentences(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        sentence = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
        if i % 7 == 0:  # some longer texts, so batches hold varied lengths
            sentence += f" Then {rng.choice(_SUBJECTS).lower()} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
        out.append(sentence)
    return out


def embedding_records(count: int, seed: int = 7) -> list[dict[str, str]]:
    return [{"id": f"s{i:05d}", "text": text} for i, text in enumerate(sentences(count, seed))]
