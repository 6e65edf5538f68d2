"""minions/kinds.py (and minions/names.py) and the schema's CHECK constraints name the same values,
so neither can drift.

The constraints are read back from pg_constraint of a migrated database: a migration that adds a
kind (a status, a state, an attempt outcome) without the Python module, or the other way round, or
that changes the name rule on one side only, fails here."""

from __future__ import annotations

import re

import asyncpg
import pytest

from minions.db.connect import connect
from minions.kinds import (
    ATTEMPT_OUTCOMES,
    DEFAULT_SUBTASK_SIZE,
    FINISHED_TASK_STATUSES,
    KINDS,
    PARAMS,
    PROBLEM_ATTEMPT_OUTCOMES,
    RUNNING_ATTEMPT,
    SUBTASK_STATES,
    TASK_STATUSES,
)
from minions.names import NAME, NAME_PATTERN
from minions.tokens import TOKEN_ROLES

_CONSTRAINTS = """
SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'
"""
_DOMAIN_CONSTRAINTS = """
SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE contypid = $1::regtype AND contype = 'c'
"""


async def _definitions(database_url: str, query: str, owner: str) -> list[str]:
    conn = await connect(database_url)
    try:
        return [row[0] for row in await conn.fetch(query, owner)]
    finally:
        await conn.close()


async def _check_values(database_url: str, table: str, pattern: str) -> tuple[str, ...]:
    """The quoted values of the one CHECK constraint on `table` whose definition matches `pattern`."""
    definitions = await _definitions(database_url, _CONSTRAINTS, table)
    matching = [d for d in definitions if re.search(pattern, d)]
    assert len(matching) == 1, (pattern, definitions)
    return tuple(re.findall(r"'([^']*)'::text", matching[0]))


@pytest.mark.parametrize("table, pattern, values", [
    ("tasks", r"^CHECK \(\(kind = ANY", KINDS),
    ("tasks", r"^CHECK \(\(status = ANY", TASK_STATUSES),
    ("tasks", r"finished_at IS NOT NULL", FINISHED_TASK_STATUSES),
    ("subtasks", r"^CHECK \(\(state = ANY", SUBTASK_STATES),
    ("subtask_attempts", r"^CHECK \(\(outcome = ANY", ATTEMPT_OUTCOMES),
    ("api_tokens", r"^CHECK \(\(role = ANY", TOKEN_ROLES),
])
async def test_python_values_match_the_schema_constraint(database_url: str, table: str, pattern: str,
                                                        values: tuple[str, ...]) -> None:
    assert await _check_values(database_url, table, pattern) == values


async def test_the_name_rule_is_the_schema_domain_pattern(database_url: str) -> None:
    definitions = await _definitions(database_url, _DOMAIN_CONSTRAINTS, "minion_name")
    assert len(definitions) == 1, definitions
    # pg_get_constraintdef writes the pattern as a literal: quotes doubled, no E'' escapes in it.
    found = re.fullmatch(r"CHECK \(\(VALUE ~ '((?:[^']|'')*)'::text\)\)", definitions[0])
    assert found is not None, definitions[0]
    assert found.group(1).replace("''", "'") == NAME_PATTERN


async def test_python_reads_the_name_pattern_as_the_database_does(database_url: str) -> None:
    # "$" in the shared pattern is the end of the text in PostgreSQL and JSON Schema; in Python it
    # would also match before a trailing newline, so NAME ends in \Z instead.
    values = {"a": True, "A0._-z": True, "x" * 64: True, "x" * 65: False, ".a": False, "": False,
              "a\n": False, "a b": False, "é": False}
    conn = await connect(database_url)
    try:
        for value, ok in values.items():
            assert (NAME.match(value) is not None) is ok, value
            assert await conn.fetchval("SELECT $1::text ~ $2", value, NAME_PATTERN) is ok, value
            try:
                await conn.fetchval("SELECT $1::minion_name", value)
                accepted = True
            except asyncpg.CheckViolationError:
                accepted = False
            assert accepted is ok, value
    finally:
        await conn.close()


def test_attempt_outcome_groups_are_attempt_outcomes() -> None:
    assert set(PROBLEM_ATTEMPT_OUTCOMES) < set(ATTEMPT_OUTCOMES)
    assert RUNNING_ATTEMPT not in ATTEMPT_OUTCOMES  # shown for a lease in progress, never stored


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
