"""Replicated spot checks and earned trust in SQL (sql/schema/11_checks.sql): the state machine a checked subtask goes
through (held, replica, quorum), what a lost replica does, and quarantine."""

from __future__ import annotations

import uuid

import asyncpg

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token, silence

CLAIM = "SELECT * FROM minion_claim_batch($1, NULL, $2)"
COMPLETE = "SELECT minion_complete($1, 1, 0.01, NULL, NULL, NULL, NULL)"
VOTE = "SELECT minion_check_vote($1, 1, 0.01, NULL, NULL, NULL, NULL, NULL, $2::smallint)"
STATE = "SELECT state FROM subtasks WHERE task_id = $1 AND subtask_id = $2"


async def _cluster(database_url: str, *, share: float = 1.0, executors: int = 3,
                   subtasks: int = 1) -> tuple[asyncpg.Connection, int, list[uuid.UUID]]:
    conn = await connect(database_url)
    await conn.execute(f"SET minions.spot_check_share = '{share}'")
    await conn.execute("SET minions.trust_agreements = '0'")
    await conn.execute("SET minions.quarantine_after = '2'")
    task_id = await make_task(conn, subtasks=subtasks)
    ids = []
    for n in range(executors):
        _, token_id = await make_token(conn, "executor")  # one owner each
        ids.append(await make_executor(conn, token_id, name=f"ex{n}"))
    return conn, task_id, ids


async def _vouch(conn: asyncpg.Connection, executor: uuid.UUID) -> None:
    """An admin vouches for the executor's token (`minions token create --trusted`)."""
    await conn.execute("UPDATE api_tokens SET trusted = true WHERE id = (SELECT token_id FROM executors WHERE id = $1)",
                       executor)


async def _claim(conn: asyncpg.Connection, executor: uuid.UUID, n: int = 1) -> list[asyncpg.Record]:
    rows = await conn.fetch(CLAIM, executor, n)
    return [r for r in rows if r["verdict"] == "leased"]


async def test_checked_result_is_held_until_a_replica_agrees(database_url: str) -> None:
    conn, task_id, (a, b, _) = await _cluster(database_url)
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    assert await conn.fetchval(STATE, task_id, 0) == "checking"
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "repeat"  # a retried complete
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) != "completed"
    # The executor that produced it is never its replica.
    assert await _claim(conn, a) == []
    [replica] = await _claim(conn, b)
    assert not replica["backup"] and replica["subtask_id"] == 0
    beats = await conn.fetch("SELECT * FROM minion_heartbeat($1, $2)", b, [replica["lease_token"]])
    assert beats[0]["state"] == "ok"
    assert await conn.fetchval("SELECT count(*) FROM minion_lease_info($1)", replica["lease_token"]) == 1
    assert await conn.fetchval(COMPLETE, replica["lease_token"]) == "replica"  # nothing changed yet
    assert await conn.fetchval(VOTE, replica["lease_token"], 1) == "agreed"
    sub = await conn.fetchrow("SELECT state, lease_token FROM subtasks WHERE task_id = $1", task_id)
    assert sub["state"] == "done" and sub["lease_token"] == lease["lease_token"]  # the first result commits
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    outcomes = await conn.fetch("SELECT executor_id, outcome FROM subtask_attempts WHERE task_id = $1", task_id)
    assert sorted((o["executor_id"] == a, o["outcome"]) for o in outcomes) == [(False, "agreed"), (True, "done")]
    # Two strangers agreeing earn no trust: only agreeing with a trusted executor does.
    trust = await conn.fetch("SELECT id, agreements FROM executors WHERE id = ANY ($1)", [a, b])
    assert {t["agreements"] for t in trust} == {0}
    assert await conn.fetchval("SELECT count(*) FROM subtask_checks") == 0
    await conn.close()


async def test_disagreement_goes_to_a_third_executor_and_the_majority_commits(database_url: str) -> None:
    conn, task_id, (a, b, c) = await _cluster(database_url)
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    [replica] = await _claim(conn, b)
    assert await conn.fetchval(VOTE, replica["lease_token"], None) == "disputed"
    assert await conn.fetchval(STATE, task_id, 0) == "checking"
    assert await _claim(conn, a) == [] and await _claim(conn, b) == []  # both ran it
    [third] = await _claim(conn, c)
    assert await conn.fetchval(VOTE, third["lease_token"], 2) == "agreed"  # with b's
    sub = await conn.fetchrow("SELECT state, lease_token FROM subtasks WHERE task_id = $1", task_id)
    assert sub["state"] == "done" and sub["lease_token"] == replica["lease_token"]
    outcome = dict(await conn.fetch("SELECT executor_id, outcome FROM subtask_attempts WHERE task_id = $1", task_id))
    assert outcome == {a: "outvoted", b: "done", c: "agreed"}
    assert await conn.fetchval("SELECT disagreements FROM executors WHERE id = $1", a) == 1
    assert await conn.fetchval("SELECT quarantined_at FROM executors WHERE id = $1", a) is None
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    await conn.close()


async def test_a_lost_replica_is_offered_again(database_url: str) -> None:
    conn, task_id, (a, b, c) = await _cluster(database_url)
    [lease] = await _claim(conn, a)
    await conn.fetchval(COMPLETE, lease["lease_token"])
    [replica] = await _claim(conn, b)
    assert await _claim(conn, c) == []  # one replica at a time
    await silence(conn, b, 300)
    assert await conn.fetchval("SELECT minion_reclaim_executor($1, 60)", b) == 1
    assert await conn.fetchval(COMPLETE, replica["lease_token"]) == "lost"
    assert await conn.fetchval(STATE, task_id, 0) == "checking"
    [again] = await _claim(conn, c)
    assert again["subtask_id"] == 0
    assert await conn.fetchval(VOTE, again["lease_token"], 1) == "agreed"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    # A released replica is offered again too.
    await conn.close()


async def test_three_different_answers_run_the_subtask_again(database_url: str) -> None:
    conn, task_id, (a, b, c) = await _cluster(database_url)
    [lease] = await _claim(conn, a)
    await conn.fetchval(COMPLETE, lease["lease_token"])
    [r1] = await _claim(conn, b)
    assert await conn.fetchval(VOTE, r1["lease_token"], None) == "disputed"
    [r2] = await _claim(conn, c)
    assert await conn.fetchval(VOTE, r2["lease_token"], None) == "no_quorum"
    assert await conn.fetchval(STATE, task_id, 0) == "pending"
    assert await conn.fetchval("SELECT count(*) FROM subtask_checks") == 0
    await conn.close()


async def test_quarantine_after_two_lost_quorums(database_url: str) -> None:
    conn, _task_id, (liar, b, c) = await _cluster(database_url, subtasks=3)
    done_by_liar = None
    for _ in range(2):
        [lease] = await _claim(conn, liar)
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
        [r1] = await _claim(conn, b)
        assert await conn.fetchval(VOTE, r1["lease_token"], None) == "disputed"
        [r2] = await _claim(conn, c)
        assert r2["subtask_id"] == lease["subtask_id"]
        assert await conn.fetchval(VOTE, r2["lease_token"], 2) == "agreed"
        done_by_liar = done_by_liar or lease
    row = await conn.fetchrow("SELECT disagreements, quarantined_at, quarantine_reason, trusted FROM executors"
                              " WHERE id = $1", liar)
    assert row["disagreements"] == 2 and row["quarantined_at"] is not None and not row["trusted"]
    assert "outvoted 2 times" in row["quarantine_reason"]
    refused = await conn.fetch(CLAIM, liar, 1)
    assert [r["verdict"] for r in refused] == ["quarantined"]
    assert await conn.fetchval("SELECT minion_release_quarantine($1)", liar)
    assert [r["verdict"] for r in await conn.fetch(CLAIM, liar, 1)] == ["leased"]
    await conn.close()


async def test_quarantine_releases_leases_and_reruns_committed_results(database_url: str) -> None:
    conn, task_id, (liar, b, _) = await _cluster(database_url, share=0.0, subtasks=4)
    # Unchecked (share 0): two results of the liar commit, a third is leased, a fourth is held.
    first, second, third = await _claim(conn, liar, 3)
    assert await conn.fetchval(COMPLETE, first["lease_token"]) == "ok"
    assert await conn.fetchval(COMPLETE, second["lease_token"]) == "ok"
    [other] = await _claim(conn, b)
    assert await conn.fetchval(COMPLETE, other["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT minion_quarantine_executor($1, 'drill')", liar) == 2
    states = dict(await conn.fetch("SELECT subtask_id, state FROM subtasks WHERE task_id = $1", task_id))
    assert states == {first["subtask_id"]: "pending", second["subtask_id"]: "pending",
                      third["subtask_id"]: "pending", other["subtask_id"]: "done"}
    assert await conn.fetchval(COMPLETE, third["lease_token"]) == "lost"
    counts = await conn.fetchrow("SELECT * FROM minion_task_counts($1)", task_id)
    assert counts["subtasks_done"] == 1 and counts["records_done"] == 1 and counts["subtasks_pending"] == 3
    # Others finish the task; the liar's revoked attempts stay in the history.
    for lease in await _claim(conn, b, 3):
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    counts = await conn.fetchrow("SELECT * FROM minion_task_counts($1)", task_id)
    assert counts["subtasks_done"] == 4 and counts["records_done"] == 4
    revoked = await conn.fetchval("SELECT count(*) FROM subtask_attempts WHERE task_id = $1 AND outcome = 'revoked'",
                                  task_id)
    assert revoked == 2
    await conn.close()


async def test_untrusted_executor_is_checked_until_it_earns_trust(database_url: str) -> None:
    conn, _task_id, (a, b, _) = await _cluster(database_url, share=0.0, subtasks=4)
    await conn.execute("SET minions.trust_agreements = '1'")
    await _vouch(conn, b)  # trust is earned only by agreeing with a trusted executor
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"  # new: checked whatever the share
    [replica] = await _claim(conn, b)
    assert await conn.fetchval(VOTE, replica["lease_token"], 1) == "agreed"
    assert await conn.fetchval("SELECT trusted FROM executors WHERE id = $1", a)  # sleep only: no fingerprint
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"  # trusted, share 0
    await conn.close()


async def test_a_lone_volunteer_commits_nothing_a_lone_vouched_executor_commits(database_url: str) -> None:
    """A volunteer alone (no replica could run) once committed its results unchecked: now its result is
    held until another owner's executor checks it. A vouched executor alone commits at once."""
    conn, task_id, (a,) = await _cluster(database_url, executors=1, subtasks=2)
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    assert await conn.fetchval(STATE, task_id, lease["subtask_id"]) == "checking"
    await _vouch(conn, a)
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "running"
    await conn.close()


async def test_cancel_drops_a_check(database_url: str) -> None:
    conn, task_id, (a, b, _) = await _cluster(database_url)
    [lease] = await _claim(conn, a)
    await conn.fetchval(COMPLETE, lease["lease_token"])
    [replica] = await _claim(conn, b)
    assert await conn.fetchval("SELECT minion_cancel_task($1)", task_id)
    assert await conn.fetchval(STATE, task_id, 0) == "cancelled"
    assert await conn.fetchval(VOTE, replica["lease_token"], 1) == "lost"
    assert await conn.fetchval("SELECT count(*) FROM subtask_checks") == 0
    await conn.close()


async def test_unset_session_checks_nothing(database_url: str) -> None:
    conn, _task_id, (a, _, _) = await _cluster(database_url)
    await conn.execute("RESET minions.spot_check_share")
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
    await conn.close()


async def test_an_unchecked_complete_reads_nothing_of_the_checks(database_url: str) -> None:
    """The hot path pays nothing: a complete of a lease not chosen for a check reads neither the held
    results nor the executors' trust (the choice is a column of the row it locks anyway), and a
    trusted executor's claim that chose none marks nothing and probes the held results once.
    (pg_stat_xact_* may still hold earlier transactions' unflushed counts: deltas are compared.)"""
    conn, _task_id, (a, _, _) = await _cluster(database_url, share=0.0, subtasks=2)
    touched = """SELECT relname, seq_scan + coalesce(idx_scan, 0) + n_tup_upd AS n FROM pg_stat_xact_user_tables
                  WHERE relname IN ('subtask_checks', 'executors', 'subtasks')"""
    [lease] = await _claim(conn, a)
    async with conn.transaction():
        before = dict(await conn.fetch(touched))
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
        after = dict(await conn.fetch(touched))
    # executors: the attempt's foreign key check (one index probe), as without spot checks; nothing else.
    assert after["subtask_checks"] - before.get("subtask_checks", 0) == 0
    assert after["executors"] - before.get("executors", 0) == 1
    async with conn.transaction():
        before = dict(await conn.fetch(touched))
        [lease] = await _claim(conn, a)
        after = dict(await conn.fetch(touched))
    chosen = "SELECT check_token IS NOT NULL FROM subtasks WHERE lease_token = $1"
    assert not await conn.fetchval(chosen, lease["lease_token"])
    # The claim asks once whether anything is held for a check at all (an empty table: no replica to
    # look for), and writes nothing there.
    assert after.get("subtask_checks", 0) - before.get("subtask_checks", 0) == 1
    await conn.close()


async def test_a_team_with_a_share_of_its_own(database_url: str) -> None:
    """minions.spot_check_team_shares gives a team its own share; other teams keep the global one."""
    conn, _, (a, _, _) = await _cluster(database_url, share=0.0, subtasks=1)
    other = await make_task(conn, team="other", subtasks=1)
    await conn.execute("SET minions.spot_check_team_shares = 'search=1,elsewhere=0'")
    leases = {r["team"]: r for r in await _claim(conn, a, 2)}
    assert await conn.fetchval(COMPLETE, leases["search"]["lease_token"]) == "held"
    assert await conn.fetchval(COMPLETE, leases["other"]["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", other) == "completed"
    assert await conn.fetchval("SELECT minion_pair_value('other', 'search=1,elsewhere=0')") is None
    await conn.close()


async def test_a_held_result_fixes_no_vector_length(database_url: str) -> None:
    """Only a committed result fixes the task's vector length: a liar's held 5-element vectors must not
    make every honest 384-element result afterwards a 'dimension_mismatch'."""
    conn, task_id, (liar, b, _) = await _cluster(database_url, subtasks=2)
    held = "SELECT minion_complete($1, 1, 0.01, NULL, NULL, NULL, NULL, $2)"
    [lease] = await _claim(conn, liar)
    assert await conn.fetchval(held, lease["lease_token"], 5) == "held"
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) is None
    [replica, other] = await _claim(conn, b, 2)
    assert replica["subtask_id"] == lease["subtask_id"] and not replica["backup"]
    vote = "SELECT minion_check_vote($1, 1, 0.01, NULL, NULL, NULL, NULL, $2, $3::smallint)"
    assert await conn.fetchval(vote, replica["lease_token"], 384, None) == "disputed"
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) is None
    # The agreed result fixes it: the third executor sides with the 384-element one.
    [third] = await _claim(conn, (await conn.fetch("SELECT id FROM executors WHERE name = 'ex2'"))[0]["id"])
    assert await conn.fetchval(vote, third["lease_token"], 384, 2) == "agreed"
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) == 384
    # From then on a held result must fit it.
    assert await conn.fetchval(held, other["lease_token"], 5) == "dimension_mismatch"
    await conn.close()


async def test_a_lease_is_checked_even_where_no_replica_could_run(database_url: str) -> None:
    """Another executor silent for the lease timeout, or quarantined, could run no replica now: the
    result is held all the same (it once committed at once, unchecked), and the replica goes to the
    first executor of another owner that comes back."""
    conn, task_id, (a, b, c) = await _cluster(database_url, subtasks=3)
    await silence(conn, b, 3600)
    await conn.execute("UPDATE executors SET quarantined_at = now(), quarantine_reason = 'test' WHERE id = $1", c)
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    assert [r["verdict"] for r in await conn.fetch(CLAIM, c, 1)] == ["quarantined"]
    await conn.execute("UPDATE heartbeats SET beat_at = now(), seen_at = now() WHERE executor_id = $1", b)
    [replica] = await _claim(conn, b)
    assert replica["subtask_id"] == lease["subtask_id"]
    assert await conn.fetchval(VOTE, replica["lease_token"], 1) == "agreed"
    counts = await conn.fetchrow("SELECT * FROM minion_task_counts($1)", task_id)
    assert (counts["subtasks_checking"], counts["subtasks_done"], counts["subtasks_pending"]) == (0, 1, 2)
    await conn.close()


async def test_a_check_that_cannot_finish_is_looked_at_after_the_wait(database_url: str) -> None:
    """After the wait a volunteer's lone candidate whose replicas never came stays held, marked overdue
    (its task warned), never committed unchecked, and is still offered; a dispute with no third
    executor runs again from the queue. A vouched executor's lone candidate commits unchecked."""
    conn, task_id, (a, b, _c) = await _cluster(database_url, subtasks=3)
    first, second, third = await _claim(conn, a, 3)
    for lease in (first, second, third):
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    [replica] = await _claim(conn, b)
    assert await conn.fetchval(VOTE, replica["lease_token"], None) == "disputed"
    assert await conn.fetchval("SELECT minion_settle_stale_checks(600)") == 0  # not stale yet
    await conn.execute("UPDATE subtask_checks SET held_at = now() - interval '1 hour'")
    assert await conn.fetchval("SELECT minion_settle_stale_checks(600)") == 3
    states = dict(await conn.fetch("SELECT subtask_id, state FROM subtasks WHERE task_id = $1", task_id))
    assert states[replica["subtask_id"]] == "pending"  # the dispute runs again
    others = sorted({first["subtask_id"], second["subtask_id"], third["subtask_id"]} - {replica["subtask_id"]})
    assert [states[o] for o in others] == ["checking", "checking"]
    assert await conn.fetchval("SELECT count(*) FROM subtask_checks WHERE overdue") == 2
    assert await conn.fetchval("SELECT minion_settle_stale_checks(600)") == 0  # marked once
    assert await conn.fetchval("SELECT agreements + disagreements FROM executors WHERE id = $1", a) == 0
    # A vouched executor's lone candidate (an admin vouched after it was held) commits unchecked.
    await _vouch(conn, a)
    await conn.execute("UPDATE subtask_checks SET overdue = false WHERE subtask_id = $1", others[0])
    assert await conn.fetchval("SELECT minion_settle_stale_checks(600)") == 1
    assert await conn.fetchval(STATE, task_id, others[0]) == "done"
    outcome = await conn.fetchval("SELECT outcome FROM subtask_attempts WHERE task_id = $1 AND subtask_id = $2"
                                  " AND executor_id = $3", task_id, others[0], a)
    assert outcome == "unchecked"
    await conn.close()


async def test_one_owner_never_replicates_itself(database_url: str) -> None:
    """Two executors of one API token could agree on a lie (or frame a third): the other of the same
    token is never offered the replica, not even once no executor of another token could run it
    (it was then, and a hostile's second name cast the deciding vote)."""
    conn = await connect(database_url)
    await conn.execute("SET minions.spot_check_share = '1'")
    task_id = await make_task(conn, subtasks=1)
    _, mine = await make_token(conn, "executor")
    _, theirs = await make_token(conn, "executor")
    a = await make_executor(conn, mine, name="mine-a")
    a2 = await make_executor(conn, mine, name="mine-b")
    b = await make_executor(conn, theirs, name="theirs")
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    assert await _claim(conn, a2) == []
    await silence(conn, b, 3600)
    assert await _claim(conn, a2) == []
    assert await conn.fetchval(STATE, task_id, 0) == "checking"
    await conn.close()


async def test_one_owner_of_several_tokens_never_replicates_itself(database_url: str) -> None:
    """Owners, not tokens: two tokens issued to one owner are one voice."""
    conn = await connect(database_url)
    await conn.execute("SET minions.spot_check_share = '1'")
    task_id = await make_task(conn, subtasks=1)
    _, first = await make_token(conn, "executor")
    _, second = await make_token(conn, "executor")
    _, stranger = await make_token(conn, "executor")
    await conn.execute("UPDATE api_tokens SET owner = 'acme' WHERE id = ANY ($1)", [first, second])
    a = await make_executor(conn, first, name="acme-a")
    a2 = await make_executor(conn, second, name="acme-b")
    b = await make_executor(conn, stranger, name="stranger")
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    assert await _claim(conn, a2) == []
    [replica] = await _claim(conn, b)
    assert await conn.fetchval(VOTE, replica["lease_token"], 1) == "agreed"
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    await conn.close()


async def test_a_vouched_executor_is_never_checked_and_its_replica_settles(database_url: str) -> None:
    """Trusted machines: a vouched executor's results commit without a check, so no
    volunteer's vote reaches it; a volunteer's held result goes to a vouched replica while one could
    run it (another volunteer is not offered it); the vouched replica's differing result commits and
    the volunteer is outvoted, and agreeing with it is how a volunteer earns trust."""
    conn, task_id, (honest, liar, other) = await _cluster(database_url, subtasks=2)
    await _vouch(conn, honest)
    [lease] = await _claim(conn, honest)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"  # share 1, and still not checked
    [lease] = await _claim(conn, liar)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    held = lease["subtask_id"]
    assert await _claim(conn, other) == []  # a volunteer is not offered it while a vouched could run it
    [replica] = await _claim(conn, honest)
    assert replica["subtask_id"] == held
    assert await conn.fetchval(VOTE, replica["lease_token"], None) == "settled"  # the trusted voice
    sub = await conn.fetchrow("SELECT state, lease_token FROM subtasks WHERE task_id = $1 AND subtask_id = $2",
                              task_id, held)
    assert sub["state"] == "done" and sub["lease_token"] == replica["lease_token"]  # the vouched result
    outcomes = dict(await conn.fetch("SELECT lease_token, outcome FROM subtask_attempts WHERE task_id = $1 "
                                     "AND subtask_id = $2", task_id, held))
    assert outcomes == {lease["lease_token"]: "outvoted", replica["lease_token"]: "done"}
    row = await conn.fetchrow("SELECT disagreements, agreements FROM executors WHERE id = $1", liar)
    assert (row["disagreements"], row["agreements"]) == (1, 0)
    assert await conn.fetchval("SELECT disagreements FROM executors WHERE id = $1", honest) == 0
    await conn.close()


async def test_a_vouched_executor_is_never_quarantined_by_votes(database_url: str) -> None:
    """Even outvoted twice (it cannot be, as its results are never checked: a defence in depth), a
    vouched executor is not quarantined."""
    conn, _task_id, (honest, a, b) = await _cluster(database_url)
    await _vouch(conn, honest)
    for n in range(3):
        await conn.execute("SELECT minion_executors_voted($1, $2, 1, $3)", [a, b], [honest], n)
    row = await conn.fetchrow("SELECT disagreements, quarantined_at FROM executors WHERE id = $1", honest)
    assert row["disagreements"] == 3 and row["quarantined_at"] is None
    await conn.close()


async def test_sampled_completions_are_not_checked(database_url: str) -> None:
    """Two honest runs of a sampled completion differ: only greedy ones (temperature 0) are checked."""
    conn = await connect(database_url)
    sampled = "SELECT minion_checkable('completion', '{}') OR minion_checkable('completion', '{\"temperature\": 0.7}')"
    assert await conn.fetchval(sampled) is False
    assert await conn.fetchval("SELECT minion_checkable('completion', '{\"temperature\": 0}')"
                               " AND minion_checkable('embedding', '{}') AND minion_checkable('sleep', '{}')")
    await conn.close()


async def test_a_requeued_subtask_forgets_its_check(database_url: str) -> None:
    """The choice is the lease's: a subtask whose checked lease was lost and claimed again by a trusted
    executor (share 0) commits at once."""
    conn, task_id, (a, b, _) = await _cluster(database_url, subtasks=1)
    [lease] = await _claim(conn, a)
    assert await conn.fetchval("SELECT check_token FROM subtasks WHERE task_id = $1", task_id) == lease["lease_token"]
    await silence(conn, a, 300)
    assert await conn.fetchval("SELECT minion_reclaim_executor($1, 60)", a) == 1
    await conn.execute("SET minions.spot_check_share = '0'")
    [again] = await _claim(conn, b)
    assert await conn.fetchval(COMPLETE, again["lease_token"]) == "ok"
    await conn.close()


async def test_a_quarantine_flagged_by_a_vote_is_settled_apart(database_url: str) -> None:
    """The vote flags the quarantine (claims refused at once); its leases and results are dealt with by
    minion_settle_quarantines, in a transaction of its own, once."""
    conn, task_id, (liar, b, c) = await _cluster(database_url, subtasks=3)
    await conn.execute("SET minions.quarantine_after = '1'")
    [lease] = await _claim(conn, liar)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    [held_other] = await _claim(conn, liar)  # still leased when the quarantine comes
    [r1] = await _claim(conn, b)
    assert r1["subtask_id"] == lease["subtask_id"]
    assert await conn.fetchval(VOTE, r1["lease_token"], None) == "disputed"
    [r2] = await _claim(conn, c)
    assert await conn.fetchval(VOTE, r2["lease_token"], 2) == "agreed"
    assert await conn.fetchval("SELECT quarantine_settled FROM executors WHERE id = $1", liar) is False
    assert [r["verdict"] for r in await conn.fetch(CLAIM, liar, 1)] == ["quarantined"]
    assert await conn.fetchval("SELECT minion_settle_quarantines()") == 0
    assert await conn.fetchval(COMPLETE, held_other["lease_token"]) == "lost"  # released
    assert await conn.fetchval(STATE, task_id, held_other["subtask_id"]) == "pending"
    assert await conn.fetchval("SELECT quarantine_settled FROM executors WHERE id = $1", liar) is True
    assert await conn.fetchval("SELECT minion_settle_quarantines()") == 0
    await conn.close()


async def test_a_result_committed_unchecked_is_revoked_by_its_quarantine(database_url: str) -> None:
    conn, task_id, (a, _b, _c) = await _cluster(database_url, subtasks=2)
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    await _vouch(conn, a)  # only a vouched executor's held result commits unchecked after the wait
    await conn.execute("UPDATE subtask_checks SET held_at = now() - interval '1 hour'")
    assert await conn.fetchval("SELECT minion_settle_stale_checks(600)") == 1
    assert await conn.fetchval(STATE, task_id, lease["subtask_id"]) == "done"
    assert await conn.fetchval("SELECT minion_quarantine_executor($1, 'drill')", a) == 1
    assert await conn.fetchval(STATE, task_id, lease["subtask_id"]) == "pending"
    await conn.close()


async def test_a_replica_of_another_length_votes_against_a_pinned_liar(database_url: str) -> None:
    """A trusted liar's unchecked 5-element vectors fix the task's length; an honest replica of 384
    elements is compared and votes (never refused), the liar loses the quorum, and its quarantine
    gives the task's length back with its revoked results."""
    conn, task_id, (liar, b, c) = await _cluster(database_url, share=0.0, subtasks=3)
    await conn.execute("SET minions.quarantine_after = '1'")
    complete = "SELECT minion_complete($1, 1, 0.01, NULL, NULL, NULL, NULL, $2)"
    vote = "SELECT minion_check_vote($1, 1, 0.01, NULL, NULL, NULL, NULL, $2, $3::smallint)"
    [first] = await _claim(conn, liar)
    assert await conn.fetchval(complete, first["lease_token"], 5) == "ok"  # unchecked: share 0
    await conn.execute("SET minions.spot_check_share = '1'")
    [lease] = await _claim(conn, liar)
    assert await conn.fetchval(complete, lease["lease_token"], 5) == "held"
    [r1] = await _claim(conn, b)
    assert await conn.fetchval(complete, r1["lease_token"], 384) == "replica"  # compared, not refused
    assert await conn.fetchval(vote, r1["lease_token"], 384, None) == "disputed"
    [r2] = await _claim(conn, c)
    assert await conn.fetchval(vote, r2["lease_token"], 384, 2) == "agreed"
    assert await conn.fetchval("SELECT quarantined_at IS NOT NULL FROM executors WHERE id = $1", liar)
    # The agreed 384-element result did not fit the liar's 5: the subtask runs again.
    assert await conn.fetchval(STATE, task_id, lease["subtask_id"]) == "pending"
    await conn.fetchval("SELECT minion_settle_quarantines()")
    assert await conn.fetchval(STATE, task_id, first["subtask_id"]) == "pending"  # revoked
    assert await conn.fetchval("SELECT embedding_dimension FROM tasks WHERE id = $1", task_id) is None
    await conn.close()


async def test_an_untrusted_executors_backup_is_held(database_url: str) -> None:
    """A new executor's first results are all checked, a straggler backup's too."""
    conn, task_id, (a, b, _c) = await _cluster(database_url, share=0.0, subtasks=4)
    await conn.execute("SET minions.trust_agreements = '5'")
    await conn.execute("UPDATE executors SET trusted = true WHERE id = $1", a)
    for lease in await _claim(conn, a, 3):
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
    [straggler] = await _claim(conn, a)
    await conn.execute("UPDATE subtasks SET leased_at = now() - interval '1 hour' WHERE lease_token = $1",
                       straggler["lease_token"])
    backup = await conn.fetchval("SELECT minion_claim_backup($1, capabilities, team::text, 4) FROM executors"
                                 " WHERE id = $1", b)
    assert backup is not None
    assert await conn.fetchval(COMPLETE, backup) == "held"
    assert await conn.fetchval(STATE, task_id, straggler["subtask_id"]) == "checking"
    assert await conn.fetchval(COMPLETE, straggler["lease_token"]) == "lost"
    await conn.close()


async def test_sampled_completions_are_checked_where_they_carry_proofs(database_url: str) -> None:
    """A sampled completion is checked only from an executor that registered proofs of generation,
    and its replica (shown the held results to verify) earns no agreement by agreeing."""
    conn = await connect(database_url)
    await conn.execute("SET minions.spot_check_share = '1'")
    task_id = await make_task(conn, kind="completion", model="m", subtasks=2)
    fingerprint = "f" * 40
    ids = []
    for n, proofs in enumerate((1, 1, None)):
        _, token_id = await make_token(conn, "executor")
        executor = await make_executor(conn, token_id, name=f"lm{n}", kinds=("completion",), models=("m",))
        entry = {"model": "m", "fingerprint": fingerprint, "precision": "fp32", "backend": "transformers",
                 **({"proofs": proofs} if proofs else {})}
        await conn.execute("SELECT minion_set_executor_fingerprints($1, $2::jsonb)", executor, [entry])
        ids.append(executor)
    proving, other_proving, plain = ids
    await _vouch(conn, other_proving)  # the one whose word earns the prover trust
    [lease] = await _claim(conn, plain)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"  # no proofs: not checked
    [lease] = await _claim(conn, proving)
    assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    [replica] = await _claim(conn, other_proving)
    assert await conn.fetchval(VOTE, replica["lease_token"], 1) == "agreed"
    agreements = dict(await conn.fetch("SELECT id, agreements FROM executors WHERE id = ANY ($1)", ids))
    assert agreements == {proving: 1, other_proving: 0, plain: 0}
    assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"
    await conn.close()


async def test_a_volunteer_alone_never_fails_a_subtask_for_good(database_url: str) -> None:
    """With checks on, a volunteer's non-retryable failure is retried, and its owner's failed or lost
    attempts of a subtask count once towards max_attempts (a hostile executor failed any task it could
    claim with one such failure, or three dropped leases). A vouched executor's word still fails it."""
    conn, task_id, (a, b, _c) = await _cluster(database_url, share=0.0, subtasks=1)
    await conn.execute("SET minions.trust_agreements = '1'")
    fail = "SELECT minion_fail($1, 'refused', false)"
    for _ in range(5):  # one owner, five tries: one attempt spent
        [lease] = await _claim(conn, a)
        assert await conn.fetchval(fail, lease["lease_token"]) == "ok"
        assert await conn.fetchval(STATE, task_id, 0) == "pending"
    assert await conn.fetchval("SELECT attempts FROM subtasks WHERE task_id = $1", task_id) == 1
    [lease] = await _claim(conn, b)  # another owner: its first counts too
    assert await conn.fetchval("SELECT minion_end_lease($1, 'lost', 'dropped', true, true)",
                               lease["lease_token"]) == "ok"
    assert await conn.fetchval("SELECT attempts FROM subtasks WHERE task_id = $1", task_id) == 2
    await _vouch(conn, a)  # an admin vouches for a: its word fails the subtask for good
    [lease] = await _claim(conn, a)
    assert await conn.fetchval(fail, lease["lease_token"]) == "ok"
    assert await conn.fetchval(STATE, task_id, 0) == "failed"
    # Checks off (trust at once): every executor's failure is taken at its word, as before.
    await conn.execute("SET minions.trust_agreements = '0'")
    other = await make_task(conn, subtasks=1)
    [lease] = await _claim(conn, b)
    assert lease["task_id"] == other
    assert await conn.fetchval(fail, lease["lease_token"]) == "ok"
    assert await conn.fetchval(STATE, other, 0) == "failed"
    await conn.close()


async def test_a_sweep_never_commits_one_groups_candidate_into_another(database_url: str) -> None:
    """A lone volunteer's candidate marked overdue, then a dispute in the same sweep: the dispute runs
    again (its own candidates), and nothing of the first is committed anywhere (the sweep once carried
    the first group's candidate into the next and committed it into the disputed subtask)."""
    conn, lone_task, (a, b, _c) = await _cluster(database_url, subtasks=1)
    disputed_task = await make_task(conn, subtasks=1, priority=5)
    [lone] = [r for r in await _claim(conn, a, 2) if r["task_id"] == lone_task] or [None]
    leases = await conn.fetch("SELECT lease_token, task_id FROM subtasks WHERE state = 'leased'")
    for lease in leases:
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "held"
    [replica] = await _claim(conn, b)
    assert replica["task_id"] == disputed_task  # the higher priority first
    assert await conn.fetchval(VOTE, replica["lease_token"], None) == "disputed"
    await conn.execute("UPDATE subtask_checks SET held_at = now() - interval '1 hour'")
    assert await conn.fetchval("SELECT minion_settle_stale_checks(600)") == 2
    assert await conn.fetchval(STATE, lone_task, 0) == "checking"
    assert await conn.fetchval(STATE, disputed_task, 0) == "pending"
    assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE state = 'done'") == 0
    assert lone is not None
    # A dispute that comes to an overdue candidate waits its own wait, not the old one's.
    [again] = await _claim(conn, b)
    assert again["task_id"] == lone_task
    assert await conn.fetchval(VOTE, again["lease_token"], None) == "disputed"
    assert await conn.fetchval("SELECT minion_settle_stale_checks(600)") == 0
    assert await conn.fetchval(STATE, lone_task, 0) == "checking"
    await conn.close()
