"""The fields of a task submission, all but its inline records: checked by the API before it takes a
task (services/api/tasks/validation.py, which adds the records) and by `minions submit` before it uploads
anything, so both refuse the same values in the same words. Every problem is reported at once, by
field name (the API answers them as a 422)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minions import jsoncodec
from minions.kinds import DEFAULT_SUBTASK_SIZE, KINDS, PARAMS, params_problems
from minions.names import NAME, NAME_RULE, model_revision_problem
from minions.nul import NUL_RULE, nul_path

MAX_SUBTASK_SIZE = 100_000
# A task's params ride in every lease of it that a claim hands out: a megabyte of them made each
# claim of 32 leases a 32 MB answer. Far beyond any real system prompt or option set.
MAX_PARAMS_BYTES = 64 * 1024
FIELDS = frozenset({"team", "project", "name", "kind", "model", "params", "priority", "subtask_size", "input",
                    "placement"})
# Who may lease a task's subtasks: any executor, or only those of a token an admin vouched for
# (sql/schema/11_checks.sql): no volunteer ever sees its input.
PLACEMENTS = ("any", "trusted")


@dataclass(frozen=True)
class TaskFields:
    """The values as given, defaults filled in; each is what its name says only if `errors` holds no
    problem for it (a caller reads them once there are none)."""

    kind: Any
    model: Any
    params: Any
    priority: Any
    subtask_size: Any
    input_uri: str | None  # None for inline records (or an input with a problem)
    placement: Any = "any"


def task_field_problems(body: dict[str, Any]) -> dict[str, str]:
    """Every problem of a submission that names its input by `input.uri`, by field."""
    errors: dict[str, str] = {}
    check_fields(body, errors)
    check_stored_values(body, errors)
    return errors


def problems_message(errors: dict[str, str]) -> str:
    return f"{len(errors)} invalid field(s): " + ", ".join(list(errors)[:5])


def check_fields(body: dict[str, Any], errors: dict[str, str]) -> TaskFields:
    """Adds to `errors` the problems of each field on its own, in the order of the fields."""
    for key in ("team", "project", "name"):
        value = body.get(key)
        if not isinstance(value, str) or not NAME.match(value):
            errors[key] = "required: " + NAME_RULE if value is None else "must be " + NAME_RULE

    kind = body.get("kind")
    if kind not in KINDS:
        errors["kind"] = f"must be one of {', '.join(KINDS)}"
    model = body.get("model", "sleep" if kind == "sleep" else None)
    if not isinstance(model, str) or not 1 <= len(model.strip()) <= 256:
        errors["model"] = "required: a model name of 1-256 characters"
    elif kind != "sleep" and (problem := model_revision_problem(model.strip())) is not None:
        errors["model"] = problem

    params = body.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        errors["params"] = "must be an object"
    elif len(jsoncodec.dumps(params)) > MAX_PARAMS_BYTES:
        errors["params"] = f"must be at most {MAX_PARAMS_BYTES // 1024} KiB as JSON"
    elif isinstance(kind, str) and kind in PARAMS:
        errors.update({f"params.{name}": problem for name, problem in params_problems(kind, params).items()})

    priority = body.get("priority", 0)
    if (problem := _int_between(priority, -1000, 1000)) is not None:
        errors["priority"] = problem
    default_size = DEFAULT_SUBTASK_SIZE.get(kind, 100) if isinstance(kind, str) else 100
    subtask_size = body.get("subtask_size", default_size)
    if subtask_size is None:
        subtask_size = default_size
    if (problem := _int_between(subtask_size, 1, MAX_SUBTASK_SIZE)) is not None:
        errors["subtask_size"] = problem
    placement = body.get("placement", "any")
    if placement is None:
        placement = "any"
    if not isinstance(placement, str) or placement not in PLACEMENTS:
        errors["placement"] = "must be any or trusted (trusted: only executors an admin vouched for run it)"
    return TaskFields(kind, model, params, priority, subtask_size, _check_input(body.get("input"), errors),
                      placement)


def check_stored_values(body: dict[str, Any], errors: dict[str, str]) -> None:
    """Adds to `errors` a NUL in a value the database stores as text (it cannot hold one) and each
    unknown field. The API checks inline records between check_fields and this."""
    raw_input = body.get("input")
    stored = {"model": body.get("model"), "params": body.get("params"),
              "input.uri": raw_input.get("uri") if isinstance(raw_input, dict) else None}
    for key, value in stored.items():
        if key not in errors and (where := nul_path(value, key)) is not None:
            errors[where] = NUL_RULE
    for key in sorted(set(body) - FIELDS):
        errors[key] = "unknown field"


def _int_between(v: Any, low: int, high: int) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        return f"must be an integer from {low} to {high}"
    return None


def _check_input(value: Any, errors: dict[str, str]) -> str | None:
    """The input's uri (None for inline records, which the API checks)."""
    if not isinstance(value, dict) or (("records" in value) == ("uri" in value)):
        errors["input"] = "required: an object with either \"records\" (a list) or \"uri\" (a string)"
        return None
    if "uri" in value:
        uri = value["uri"]
        if not isinstance(uri, str) or not uri.strip():
            errors["input.uri"] = "must be a non-empty string"
            return None
        return uri.strip()
    return None
