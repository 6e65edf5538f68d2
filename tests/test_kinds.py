"""minions/kinds.py and the schema's CHECK constraints name the same values, so neither can drift.

The constraints are read back from pg_constraint of a migrated database: a migration that adds a
kind (or a status) without the Python module, or the other way round, fails here."""

from __future__ import annotations

import re

import pytest

from minions.db.connect import connect
from minions.kinds import DEFAULT_SUBTASK_SIZE, FINISHED_TASK_STATUSES, KINDS, PARAMS, SUBTASK_STATES, TASK_STATUSES
from minions.tokens import TOKEN_ROLES

_CONSTRAINTS = """
SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'
"""


async def _check_values(database_url: str, table: str, pattern: str) -> tuple[str, ...]:
    """The quoted values of the one CHECK constraint on `table` whose definition matches `pattern`."""
    conn = await connect(database_url)
    try:
        definitions = [row[0] for row in await conn.fetch(_CONSTRAINTS, table)]
    finally:
        await conn.close()
    matching = [d for d in definitions if re.search(pattern, d)]
    assert len(matching) == 1, (pattern, definitions)
    return tuple(re.findall(r"'([^']*)'::text", matching[0]))


@pytest.mark.parametrize("table, pattern, values", [
    ("tasks", r"^CHECK \(\(kind = ANY", KINDS),
    ("tasks", r"^CHECK \(\(status = ANY", TASK_STATUSES),
    ("tasks", r"finished_at IS NOT NULL", FINISHED_TASK_STATUSES),
    ("subtasks", r"^CHECK \(\(state = ANY", SUBTASK_STATES),
    ("api_tokens", r"^CHECK \(\(role = ANY", TOKEN_ROLES),
])
async def test_python_values_match_the_schema_constraint(database_url: str, table: str, pattern: str,
                                                        values: tuple[str, ...]) -> None:
    assert await _check_values(database_url, table, pattern) == values


def test_every_kind_has_its_params_and_default_subtask_size() -> None:
    assert set(PARAMS) == set(DEFAULT_SUBTASK_SIZE) == set(KINDS)
    assert set(FINISHED_TASK_STATUSES) < set(TASK_STATUSES)


@pytest.mark.parametrize("kind, name, value, problem", [
    ("embedding", "normalize", 1, "must be true or false"),
    ("embedding", "pooling", "max", 'must be "mean" or "cls"'),
    ("embedding", "max_length", True, "must be an integer from 1 to 8192"),
    ("embedding", "batch_size", 4097, "must be an integer from 1 to 4096"),
    ("completion", "temperature", 10.5, "must be a number from 0 to 10"),
    ("completion", "system", 3, "must be a string"),
])
def test_param_rules_refuse_with_the_api_message(kind: str, name: str, value: object, problem: str) -> None:
    assert PARAMS[kind][name].problem(value) == problem


@pytest.mark.parametrize("kind, name, value", [
    ("embedding", "normalize", False), ("embedding", "pooling", "cls"), ("embedding", "max_length", 8192),
    ("completion", "temperature", 0), ("completion", "seed", -(2**63)), ("completion", "system", ""),
])
def test_param_rules_accept_values_at_their_bounds(kind: str, name: str, value: object) -> None:
    assert PARAMS[kind][name].problem(value) is None
