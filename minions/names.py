"""Names of teams, projects and tasks (API.md): 1-64 of [A-Za-z0-9._-], starting alphanumeric.

The rule is written here once: the executor protocol's messages and the OpenAPI document take
NAME_PATTERN as it is, and the schema's `minion_name` domain checks the same pattern
(tests/core/test_kinds.py reads it back from the catalog)."""

from __future__ import annotations

import re

# As JSON Schema (ECMA-262) and PostgreSQL read it: there "$" is the end of the text.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# For Python, \Z instead of $: "$" also matches before a trailing newline, which the database refuses.
NAME = re.compile(NAME_PATTERN.removesuffix("$") + r"\Z")
NAME_RULE = "1-64 characters of [A-Za-z0-9._-], starting with a letter or digit"


def is_name(value: object) -> bool:
    return isinstance(value, str) and NAME.match(value) is not None


# A model fingerprint (what an executor reports it loaded: a Hugging Face commit, sha256:<hex> of the
# model's files, an Ollama digest), also the revision of a task's `model` given as name@revision.
FINGERPRINT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,159}\Z")
FINGERPRINT_RULE = "1-160 characters of [A-Za-z0-9:._-], starting with a letter or digit"


def model_revision_problem(model: str) -> str | None:
    """What is wrong with the revision of `name@revision` (it pins the task's model fingerprint: a
    Hugging Face commit, a sha256:<hex> or an Ollama digest), or None (no revision, or a good one)."""
    name, at, revision = model.rpartition("@")
    if not at:
        return None
    if not name or not FINGERPRINT.fullmatch(revision):
        return ("a model pinned to a revision is name@revision, the revision " + FINGERPRINT_RULE
                + " (the fingerprint an executor reports for the model)")
    return None
