"""Validating a task submission: every problem is reported at once, by field (422)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from minions import jsoncodec
from minions.kinds import DEFAULT_SUBTASK_SIZE, KINDS, PARAMS, params_problems
from minions.names import NAME, NAME_RULE, model_revision_problem
from minions.services.api.errors import bad_request, invalid
from minions.services.api.inline_records import MalformedRecords, SpooledRecords, scan_records
from minions.services.api.nul import NUL_RULE, nul_path

MAX_SUBTASK_SIZE = 100_000
MAX_FIELD_ERRORS = 20


def _int_between(v: Any, low: int, high: int) -> str | None:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        return f"must be an integer from {low} to {high}"
    return None


@dataclass(frozen=True)
class TaskRequest:
    team: str
    project: str
    name: str
    kind: str
    model: str
    params: dict[str, Any]
    priority: int
    subtask_size: int
    records: SpooledRecords | None  # inline records, as the JSONL the store will hold
    input_uri: str | None
    request_hash: str


def validate_task(body: dict[str, Any], records: memoryview | None = None,
                  read_errors: dict[str, str] | None = None) -> TaskRequest:
    """`body` is the submission without input.records; `records` is that array still encoded
    (streamed, never decoded whole). Blocking for large inputs: run it in a thread."""
    errors: dict[str, str] = dict(read_errors or {})
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

    # The fingerprint's prefix is known before the records: they are hashed as they stream by.
    fingerprint = hashlib.sha256()
    input_uri = _validate_input(body.get("input"), errors)
    fingerprint.update(jsoncodec.dumps([kind, model, params, priority, subtask_size, input_uri]))
    spooled = None
    if records is not None and "input" not in errors:
        if not _is_nonempty_list(records):
            errors["input.records"] = "must be a non-empty list of records"
        elif kind in KINDS:
            spooled = _scan(records, str(kind), fingerprint, errors)
    raw_input = body.get("input")
    stored = {"model": body.get("model"), "params": body.get("params"),
              "input.uri": raw_input.get("uri") if isinstance(raw_input, dict) else None}
    for key, value in stored.items():
        if key not in errors and (where := nul_path(value, key)) is not None:
            errors[where] = NUL_RULE
    unknown = set(body) - {"team", "project", "name", "kind", "model", "params", "priority",
                           "subtask_size", "input"}
    for key in sorted(unknown):
        errors[key] = "unknown field"
    if errors:
        if spooled is not None:
            spooled.close()
        raise invalid(errors, f"{len(errors)} invalid field(s): " + ", ".join(list(errors)[:5]))

    assert isinstance(kind, str) and isinstance(model, str) and isinstance(params, dict)
    return TaskRequest(
        team=body["team"], project=body["project"], name=body["name"], kind=kind, model=model.strip(),
        params=params, priority=priority, subtask_size=subtask_size, records=spooled,
        input_uri=input_uri, request_hash=fingerprint.hexdigest(),
    )


def _validate_input(value: Any, errors: dict[str, str]) -> str | None:
    """The input's uri (None for inline records, which `_scan` checks)."""
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


def _is_nonempty_list(encoded: memoryview) -> bool:
    if bytes(encoded[:1]) != b"[":
        return False
    for byte in encoded[1:]:  # stops at the first element (or the closing bracket)
        if byte not in b" \t\r\n":
            return bool(byte != ord("]"))
    return False


def _scan(records: memoryview, kind: str, fingerprint: Any, errors: dict[str, str]) -> SpooledRecords | None:
    try:
        scan = scan_records(kind, records, fingerprint, MAX_FIELD_ERRORS)
    except MalformedRecords as exc:
        if "integer overflow" in str(exc):
            # Valid JSON that cannot be stored: a record's field (422), not a malformed body (400).
            raise invalid({"input.records": "an integer is out of range (records are stored as JSON with "
                                            "64-bit integers): send it as a string or a float"}) from None
        raise bad_request(f"input.records is not valid JSON: {exc}", "malformed_json") from None
    for index, problem in scan.problems.items():
        errors[f"input.records[{index}]"] = problem
    if scan.problem_count > MAX_FIELD_ERRORS:
        errors["input.records"] = f"{scan.problem_count} invalid records; the first {MAX_FIELD_ERRORS} are listed"
    return scan.records
