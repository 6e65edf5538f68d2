"""Rows for tests, made through the same SQL functions the services use (no shortcuts around the
schema's invariants)."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from minions.tokens import hash_token, new_token


async def make_token(conn: asyncpg.Connection, role: str, team: str | None = None, *,
                     trusted: bool = False, owner: str | None = None) -> tuple[str, int]:
    """A token (secret, id); `trusted`: an executor token an admin vouches for; `owner`: whom it was
    issued to (None: itself)."""
    token = new_token()
    token_id = await conn.fetchval(
        "INSERT INTO api_tokens (token_hash, role, team) VALUES ($1, $2, $3) RETURNING id",
        hash_token(token), role, team,
    )
    if trusted or owner is not None:  # (the plain insert also serves schemas from before these columns)
        await conn.execute("UPDATE api_tokens SET trusted = $2, owner = $3 WHERE id = $1", token_id, trusted, owner)
    return token, token_id


async def make_tokens(database_url: str) -> tuple[str, str]:
    """An admin token and an executor token, on their own connection."""
    from minions.db.connect import connect

    conn = await connect(database_url)
    try:
        admin, _ = await make_token(conn, "admin")
        executor, _ = await make_token(conn, "executor")
    finally:
        await conn.close()
    return admin, executor


async def make_task(conn: asyncpg.Connection, *, team: str = "search", project: str = "ranker",
                    name: str | None = None, kind: str = "sleep", model: str = "sleep",
                    subtasks: int = 10, records_per_subtask: int = 1, priority: int = 0,
                    max_attempts: int = 3, input_uri: str = "file:///nowhere.jsonl", placement: str = "any") -> int:
    """A task already split into `subtasks` subtasks (byte ranges are nominal)."""
    name = name or f"t-{uuid.uuid4().hex[:8]}"
    task_id: int = await conn.fetchval(
        """INSERT INTO tasks (team, project, name, kind, model, priority, subtask_size, max_attempts,
                              input_uri, request_hash, placement)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'h', $10) RETURNING id""",
        team, project, name, kind, model, priority, records_per_subtask, max_attempts, input_uri, placement,
    )
    await conn.fetchrow("SELECT * FROM minion_begin_split($1)", task_id)
    starts = [i * 100 for i in range(subtasks)]
    ends = [s + 100 for s in starts]
    firsts = [i * records_per_subtask for i in range(subtasks)]
    counts = [records_per_subtask] * subtasks
    ok = await conn.fetchval(
        "SELECT minion_add_subtasks($1, $2, $3, $4, $5, 0, $6, $7)",
        task_id, starts, ends, firsts, counts, ends[-1] if ends else 0, subtasks * records_per_subtask,
    )
    assert ok
    await conn.execute("SELECT minion_finish_split($1)", task_id)
    return task_id


async def make_executor(conn: asyncpg.Connection, token_id: int, *, name: str | None = None,
                        team: str | None = None, kinds: tuple[str, ...] = ("sleep",),
                        models: tuple[str, ...] = (), preferences: list[dict[str, Any]] | None = None,
                        ) -> uuid.UUID:
    executor_id: uuid.UUID = await conn.fetchval(
        "SELECT minion_register_executor($1, $2, $3, '{}'::jsonb, $4, $5, $6::jsonb)",
        token_id, team, name or f"ex-{uuid.uuid4().hex[:8]}", list(kinds), list(models),
        preferences or [],
    )
    return executor_id



async def silence(conn: asyncpg.Connection, executor_id: uuid.UUID, seconds: float) -> None:
    """Make an executor look silent for `seconds` (no heartbeat, no claim)."""
    await conn.execute(
        "UPDATE heartbeats SET beat_at = now() - make_interval(secs => $2),"
        " seen_at = now() - make_interval(secs => $2) WHERE executor_id = $1", executor_id, float(seconds))
