"""A pool's worth of ended attempts of every outcome, made through the SQL functions the services
run, for the tests of the usage account (sql/schema/16_usage.sql), its API, CLI, web page and Grafana
panels; and the account recomputed from the attempts themselves, to hold it to."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from minions.testing.factories import make_executor, make_task, silence
from minions.tokens import hash_token, new_token, token_prefix

# How each outcome counts, restated here (not read from the schema) so the account is checked
# against an independent reading of docs/API.md.
USE = {"done": "used", "unchecked": "used", "candidate": "used", "failed": "used", "cancelled": "used",
       "superseded": "used", "agreed": "verification", "outvoted": "verification",
       "lost": "lost", "released": "lost", "revoked": "lost"}
CLAIM = "SELECT * FROM minion_claim_batch($1, NULL, 1) WHERE verdict = 'leased'"
COMPLETE = "SELECT minion_complete($1, $2, $3)"
VOTE = "SELECT minion_check_vote($1, 1, $2, NULL, NULL, NULL, NULL, NULL, $3::smallint)"
LOST_LEASE_S = 30.0  # how long the lost attempt's lease had run when its executor went silent


@dataclass
class Pool:
    executors: dict[str, uuid.UUID] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    unlabelled_token: int = 0


async def _owner(conn: asyncpg.Connection, label: str) -> int:
    secret = new_token()
    token_id: int = await conn.fetchval("SELECT minion_create_token($1, $2, 'executor', NULL, $3, NULL, NULL, false)",
                                        hash_token(secret), token_prefix(secret), label)
    return token_id


async def _done(conn: asyncpg.Connection, executor: uuid.UUID, seconds: float) -> asyncpg.Record:
    lease = await conn.fetchrow(CLAIM, executor)
    assert lease is not None
    assert await conn.fetchval(COMPLETE, lease["lease_token"], lease["records"], seconds) == "ok"
    return lease


async def build_pool(conn: asyncpg.Connection) -> Pool:
    """Owners alice (alice-mbp, alice-studio, alice-air), bob (bob-box), mallory (liar) and an
    unlabelled token (lab-box, lab-2). Team 'search': a failure then its retry done, two done, a lease
    lost after 30 s and its retry done, then spot checks (every lease checked): the liar's committed
    result revoked by its quarantine, its held result outvoted, alice-air's agreed with by lab-2
    (agreed), lab-2's committed unchecked, alice-air's held still (candidate). Team 'ads': two done by
    bob, one released, one cancelled."""
    await conn.execute("SET minions.spot_check_share = '0'")
    await conn.execute("SET minions.trust_agreements = '0'")
    pool = Pool()
    alice, bob, mallory = (await _owner(conn, "alice"), await _owner(conn, "bob"), await _owner(conn, "mallory"))
    pool.unlabelled_token = await _owner(conn, "")
    for name, token_id in (("alice-mbp", alice), ("alice-studio", alice), ("alice-air", alice), ("bob-box", bob),
                           ("liar", mallory), ("lab-box", pool.unlabelled_token), ("lab-2", pool.unlabelled_token)):
        pool.executors[name] = await make_executor(conn, token_id, name=name)
    ex = pool.executors

    pool.tasks["s-fail"] = await make_task(conn, team="search", name="s-fail", subtasks=1, records_per_subtask=4)
    lease = await conn.fetchrow(CLAIM, ex["alice-mbp"])
    assert await conn.fetchval("SELECT minion_fail($1, 'CUDA out of memory', true)", lease["lease_token"]) == "ok"
    await _done(conn, ex["alice-mbp"], 0.5)
    pool.tasks["s-main"] = await make_task(conn, team="search", name="s-main", subtasks=2, records_per_subtask=5)
    await _done(conn, ex["alice-studio"], 1.25)
    await _done(conn, ex["lab-box"], 2.0)
    pool.tasks["s-lost"] = await make_task(conn, team="search", name="s-lost", subtasks=1, records_per_subtask=3)
    lease = await conn.fetchrow(CLAIM, ex["bob-box"])
    await conn.execute("UPDATE subtasks SET leased_at = leased_at - make_interval(secs => $2) WHERE lease_token = $1",
                       lease["lease_token"], LOST_LEASE_S)
    await silence(conn, ex["bob-box"], 3600)
    assert await conn.fetchval("SELECT minion_reclaim_executor($1, 120)", ex["bob-box"]) == 1
    await _done(conn, ex["alice-mbp"], 0.25)

    pool.tasks["a-main"] = await make_task(conn, team="ads", name="a-main", subtasks=2, records_per_subtask=2)
    await _done(conn, ex["bob-box"], 3.0)
    lease = await conn.fetchrow(CLAIM, ex["bob-box"])
    assert await conn.fetchval("SELECT minion_release($1)", lease["lease_token"]) == "ok"
    await _done(conn, ex["bob-box"], 1.0)
    pool.tasks["a-cancel"] = await make_task(conn, team="ads", name="a-cancel", subtasks=1)
    assert await conn.fetchrow(CLAIM, ex["lab-box"]) is not None
    assert await conn.fetchval("SELECT minion_cancel_task($1)", pool.tasks["a-cancel"])

    await _spot_checks(conn, pool)
    return pool


async def _spot_checks(conn: asyncpg.Connection, pool: Pool) -> None:
    ex = pool.executors
    pool.tasks["s-open"] = await make_task(conn, team="search", name="s-open", subtasks=2)
    await _done(conn, ex["liar"], 0.01)
    await conn.execute("SET minions.spot_check_share = '1'")
    await conn.execute("SET minions.trust_agreements = '1'")
    pool.tasks["s-disputed"] = await make_task(conn, team="search", name="s-disputed", subtasks=1, priority=10)
    held = await conn.fetchrow(CLAIM, ex["liar"])
    assert await conn.fetchval(COMPLETE, held["lease_token"], 1, 0.01) == "held"
    second = await conn.fetchrow(CLAIM, ex["alice-air"])
    assert second["task_id"] == held["task_id"]
    assert await conn.fetchval(VOTE, second["lease_token"], 0.02, None) == "disputed"
    third = await conn.fetchrow(CLAIM, ex["lab-2"])
    assert await conn.fetchval(VOTE, third["lease_token"], 0.04, 2) == "agreed"  # with alice-air's
    assert await conn.fetchval("SELECT minion_quarantine_executor($1, 'returned random vectors')", ex["liar"]) == 1
    pool.tasks["s-stale"] = await make_task(conn, team="search", name="s-stale", subtasks=1, priority=10)
    lease = await conn.fetchrow(CLAIM, ex["lab-2"])
    assert await conn.fetchval(COMPLETE, lease["lease_token"], 1, 0.04) == "held"
    # Vouched for once held: its lone result commits unchecked after the wait (a volunteer's stays held).
    await conn.execute("UPDATE api_tokens SET trusted = true WHERE id = $1", pool.unlabelled_token)
    assert await conn.fetchval("SELECT minion_settle_stale_checks(0)") == 1
    pool.tasks["s-held"] = await make_task(conn, team="search", name="s-held", subtasks=1, priority=10)
    lease = await conn.fetchrow(CLAIM, ex["alice-air"])
    assert await conn.fetchval(COMPLETE, lease["lease_token"], 1, 0.02) == "held"
    await conn.execute("RESET minions.spot_check_share")
    await conn.execute("RESET minions.trust_agreements")


async def attempts(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every ended attempt with its team, executor and owner label, as stored."""
    rows = await conn.fetch(
        """SELECT t.team::text AS team, a.executor_id, e.name AS executor, k.id AS token_id, k.label, a.outcome,
                  a.seconds, extract(epoch FROM a.ended_at - a.started_at)::double precision AS wall_s, a.records,
                  a.ended_at
             FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
             LEFT JOIN executors e ON e.id = a.executor_id LEFT JOIN api_tokens k ON k.id = e.token_id""")
    return [dict(r) for r in rows]


def account(rows: list[dict[str, Any]], by: str) -> dict[str | None, dict[str, float]]:
    """The usage account recomputed from the attempts: per team, executor name or owner label, each
    attempt's reported seconds (its lease's wall time when it reported none) summed by use."""
    totals: dict[str | None, dict[str, float]] = defaultdict(
        lambda: {"used_s": 0.0, "verification_s": 0.0, "lost_s": 0.0, "records": 0, "attempts": 0})
    for r in rows:
        key = {"team": r["team"], "executor": r["executor"],
               "owner": r["label"] or (f"token {r['token_id']}" if r["token_id"] else None)}[by]
        use = USE[r["outcome"]]
        totals[key][f"{use}_s"] += r["seconds"] if r["seconds"] is not None else max(r["wall_s"], 0.0)
        if use == "used":
            totals[key]["records"] += r["records"] or 0
        totals[key]["attempts"] += 1
    return dict(totals)
