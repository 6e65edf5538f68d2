"""A task's fields are checked in one place (minions/task_fields.py): `minions submit` before it
uploads, the API before it takes the task; both refuse the same values in the same words."""

from __future__ import annotations

from typing import Any

import pytest

from minions.services.api.http.errors import ApiError
from minions.services.api.tasks.validation import validate_task
from minions.task_fields import problems_message, task_field_problems

GOOD: dict[str, Any] = {"team": "t", "project": "p", "name": "n", "kind": "sleep",
                        "input": {"uri": "s3://bucket/input.jsonl"}}


def test_good_fields_have_no_problem() -> None:
    assert task_field_problems(GOOD) == {}
    assert validate_task(GOOD).input_uri == "s3://bucket/input.jsonl"


def test_the_cli_and_the_api_name_the_same_problems_in_the_same_order() -> None:
    body = {**GOOD, "team": "no spaces", "kind": "embedding", "model": "m\x00", "priority": 5000,
            "subtask_size": 0, "surprise": 1}
    problems = task_field_problems(body)
    assert list(problems) == ["team", "priority", "subtask_size", "model", "surprise"]
    assert problems["model"] == "must not contain the NUL character (\\u0000)"
    with pytest.raises(ApiError) as refused:
        validate_task(body)
    assert refused.value.status == 422 and refused.value.fields == problems
    assert refused.value.message == problems_message(problems) == \
        "5 invalid field(s): team, priority, subtask_size, model, surprise"


def test_params_are_capped_at_64_kib() -> None:
    """A task's params ride in every lease a claim hands out: a 1 MB system prompt made one claim of
    32 leases a 32 MB answer. Refused at submission, by the CLI and the API alike."""
    fits = {**GOOD, "kind": "completion", "model": "m", "params": {"system": "x" * (60 * 1024)}}
    assert task_field_problems(fits) == {}
    huge = {**fits, "params": {"system": "x" * (1024 * 1024)}}
    assert task_field_problems(huge) == {"params": "must be at most 64 KiB as JSON"}
    with pytest.raises(ApiError) as refused:
        validate_task(huge)
    assert refused.value.status == 422
