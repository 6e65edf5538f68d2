"""Validating a task submission: every problem is reported at once, by field (422). The fields are
checked by minions/task_fields.py (`minions submit` checks them the same way before it uploads);
this adds the inline records, streamed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from minions import jsoncodec
from minions.kinds import KINDS
from minions.services.api.http.errors import bad_request, invalid
from minions.services.api.tasks.inline_records import MalformedRecords, SpooledRecords, scan_records
from minions.task_fields import check_fields, check_stored_values, problems_message

MAX_FIELD_ERRORS = 20


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
    placement: str
    records: SpooledRecords | None  # inline records, as the JSONL the store will hold
    input_uri: str | None
    request_hash: str


def validate_task(body: dict[str, Any], records: memoryview | None = None,
                  read_errors: dict[str, str] | None = None) -> TaskRequest:
    """`body` is the submission without input.records; `records` is that array still encoded
    (streamed, never decoded whole). Blocking for large inputs: run it in a thread."""
    errors: dict[str, str] = dict(read_errors or {})
    fields = check_fields(body, errors)
    # The fingerprint's prefix is known before the records: they are hashed as they stream by.
    fingerprint = hashlib.sha256()
    # The placement joins the hash only when not the default: a task submitted before it existed is
    # re-submitted as the same body.
    fingerprint.update(jsoncodec.dumps([fields.kind, fields.model, fields.params, fields.priority,
                                        fields.subtask_size, fields.input_uri]
                                       + ([fields.placement] if fields.placement != "any" else [])))
    spooled = None
    if records is not None and "input" not in errors:
        if not _is_nonempty_list(records):
            errors["input.records"] = "must be a non-empty list of records"
        elif fields.kind in KINDS:
            spooled = _scan(records, str(fields.kind), fingerprint, errors)
    check_stored_values(body, errors)
    if errors:
        if spooled is not None:
            spooled.close()
        raise invalid(errors, problems_message(errors))

    kind, model, params = fields.kind, fields.model, fields.params
    assert isinstance(kind, str) and isinstance(model, str) and isinstance(params, dict)
    return TaskRequest(
        team=body["team"], project=body["project"], name=body["name"], kind=kind, model=model.strip(),
        params=params, priority=fields.priority, subtask_size=fields.subtask_size, placement=fields.placement,
        records=spooled,
        input_uri=fields.input_uri, request_hash=fingerprint.hexdigest(),
    )


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
