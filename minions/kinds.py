"""The task kinds, their params and default subtask sizes, the task statuses, the subtask states and
the attempt outcomes: defined here once.

The API's validation, the OpenAPI document, the executor runners, the CLI, the SDK and the web UI
(through GET /api/v1/meta) all read these; the schema restates the kinds, statuses, states and
outcomes in CHECK constraints, and tests/core/test_kinds.py reads those back from the catalog of a
migrated database and holds the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

KINDS: Final = ("embedding", "completion", "sleep")
TASK_STATUSES: Final = ("submitted", "splitting", "queued", "running", "completed", "failed", "cancelled")
# A task in one of these has ended: it changes no more (its finished_at is set).
FINISHED_TASK_STATUSES: Final = ("completed", "failed", "cancelled")
# A task in one of these has no subtasks yet: the splitter (or a small submission) has not split it.
UNSPLIT_TASK_STATUSES: Final = ("submitted", "splitting")
# checking: completed once, its result held until a spot check's replica agrees.
SUBTASK_STATES: Final = ("pending", "leased", "checking", "done", "failed", "cancelled")
# How an ended attempt (a row of subtask_attempts) ended. lost: its lease expired; released: its
# executor gave it back; superseded: another lease's result for the subtask committed first. The
# spot checks add: candidate, a result held for a check; agreed, a replica that matched the committed
# result; outvoted, a result on the losing side of a quorum (or of no quorum); revoked, a committed
# result of an executor later quarantined, run again; unchecked, a held result committed because no
# check could finish in time.
ATTEMPT_OUTCOMES: Final = ("done", "failed", "lost", "released", "cancelled", "superseded", "candidate", "agreed",
                           "outvoted", "revoked", "unchecked")
# A subtask's history (GET .../subtasks) lists the lease in progress, which has no row yet, with this outcome.
RUNNING_ATTEMPT: Final = "running"
# The attempts whose work did not stand (the subtask ran again, or failed): what the web UI counts as
# retries and failures.
PROBLEM_ATTEMPT_OUTCOMES: Final = ("failed", "lost", "released", "cancelled", "outvoted", "revoked")
# Records per subtask when a submission gives none: a completion record costs far more than an
# embedding one, so it is cut smaller to keep a lease short.
DEFAULT_SUBTASK_SIZE: Final = {"embedding": 500, "completion": 50, "sleep": 100}


@dataclass(frozen=True)
class Param:
    """One param of a kind: its JSON type, its bounds or choices, and the runner's default."""

    type: Literal["boolean", "integer", "number", "string"]
    minimum: int | float | None = None
    maximum: int | float | None = None
    choices: tuple[str, ...] = ()
    default: Any = None

    def problem(self, value: Any) -> str | None:
        """Why `value` is refused (the API's 422 message for the field), or None."""
        if self.type == "boolean":
            return None if isinstance(value, bool) else "must be true or false"
        if self.type == "string":
            if self.choices:
                return None if value in self.choices else "must be " + " or ".join(f'"{c}"' for c in self.choices)
            return None if isinstance(value, str) else "must be a string"
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if self.type == "integer":
            ok = numeric and isinstance(value, int) and self._within(value)
            return None if ok else f"must be an integer from {self.minimum} to {self.maximum}"
        return None if numeric and self._within(value) else f"must be a number from {self.minimum} to {self.maximum}"

    def _within(self, value: int | float) -> bool:
        return (self.minimum is None or value >= self.minimum) and (self.maximum is None or value <= self.maximum)


PARAMS: Final[dict[str, dict[str, Param]]] = {
    "embedding": {
        "normalize": Param("boolean", default=True),
        "pooling": Param("string", choices=("mean", "cls"), default="mean"),
        "max_length": Param("integer", 1, 8192, default=256),
        "batch_size": Param("integer", 1, 4096),  # None: the size chosen for the device at model load
    },
    "completion": {
        # The defaults are the runners' (0.8 is Ollama's own temperature, so both backends sample
        # alike); a bound on tokens keeps a runaway model from holding a lease for ever.
        "temperature": Param("number", 0, 10, default=0.8),
        "max_tokens": Param("integer", 1, 131072, default=256),
        "seed": Param("integer", -(2**63), 2**63 - 1),
        "system": Param("string"),
    },
    "sleep": {},
}


def params_problems(kind: str, params: dict[str, Any]) -> dict[str, str]:
    """Each refused param of a `kind` task, keyed by its name: unknown, or failing its rule."""
    known = PARAMS[kind]
    problems = {}
    for name, value in params.items():
        param = known.get(name)
        if param is None:
            problems[name] = f"unknown parameter for {kind} (known: {', '.join(known) or 'none'})"
        elif (problem := param.problem(value)) is not None:
            problems[name] = problem
    return problems
