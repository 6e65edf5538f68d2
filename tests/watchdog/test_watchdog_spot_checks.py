"""The watchdog's sweep ends what spot checks and leases cannot end by themselves (real watchdog
process): a volunteer's held result no replica judged within MINIONS_SPOT_CHECK_WAIT_S is marked
overdue and stays held (never committed unchecked) until a vouched executor settles it; a quarantine a
vote flagged but left unsettled (the API died before settling it) is settled: its executor's leases
released; and a hanger that claims and heartbeats without finishing loses its lease at the age cap."""

from __future__ import annotations

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token
from minions.testing.processes import Services
from minions.testing.waiting import eventually


async def test_the_sweep_marks_stale_checks_and_settles_quarantines(services: Services) -> None:
    services.extra_env = {**services.extra_env, "MINIONS_SPOT_CHECK_WAIT_S": "1", "MINIONS_SWEEP_INTERVAL_S": "0.5"}
    services.workdir.mkdir(parents=True, exist_ok=True)
    services.start("watchdog")
    conn = await connect(services.database_url)
    try:
        await conn.execute("SET minions.spot_check_share = '1'")
        task_id = await make_task(conn, subtasks=2)
        a, b = [await make_executor(conn, (await make_token(conn, "executor"))[1], name=n) for n in ("a", "b")]
        held, _ = await conn.fetch("SELECT * FROM minion_claim_batch($1, NULL, 2)", a)
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", held["lease_token"]) == "held"
        # b takes the replica, then is quarantined by hand, as a vote flags it: not settled yet.
        [replica] = await conn.fetch("SELECT * FROM minion_claim_batch($1, NULL, 1)", b)
        assert replica["verdict"] == "leased" and replica["subtask_id"] == held["subtask_id"]
        await conn.execute("UPDATE executors SET quarantined_at = now(), quarantine_reason = 'drill',"
                           " quarantine_settled = false WHERE id = $1", b)

        async def overdue() -> bool:
            return await conn.fetchval("SELECT overdue FROM subtask_checks WHERE lease_token = $1",
                                       held["lease_token"])

        async def settled() -> bool:
            return await conn.fetchval("SELECT quarantine_settled FROM executors WHERE id = $1", b)

        await eventually(overdue, "the stale check to be marked overdue", timeout_s=30)
        await eventually(settled, "the quarantine to be settled", timeout_s=30)
        assert await conn.fetchval("SELECT state FROM subtasks WHERE task_id = $1 AND subtask_id = $2",
                                   task_id, held["subtask_id"]) == "checking"  # held, not committed
        # The replica was released by the quarantine: it counts for nothing.
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", replica["lease_token"]) == "lost"
        # A vouched executor comes: the replica goes to it, and its agreement commits the held result.
        _, vouched_token = await make_token(conn, "executor", trusted=True)
        c = await make_executor(conn, vouched_token, name="c")
        [check] = await conn.fetch("SELECT * FROM minion_claim_batch($1, NULL, 1)", c)
        assert check["subtask_id"] == held["subtask_id"]
        vote = "SELECT minion_check_vote($1, 1, 0.01, NULL, NULL, NULL, NULL, NULL, 1::smallint)"
        assert await conn.fetchval(vote, check["lease_token"]) == "agreed"
        assert await conn.fetchval("SELECT outcome FROM subtask_attempts WHERE lease_token = $1",
                                   held["lease_token"]) == "done"
    finally:
        await conn.close()


async def test_a_hanger_loses_its_lease_at_the_age_cap_then_is_quarantined(services: Services) -> None:
    """An executor that claims and heartbeats but never completes held a task open for 15 minutes. The
    age cap (here 2 s: nothing measured yet, the kinds' ceiling) ends its lease, heartbeats or not: the
    subtask is pending again with its attempt not counted, the hanger counts a disagreement, and the
    second time it is quarantined. A vouched executor's lease past the cap is ended too, without blame."""
    services.extra_env = {**services.extra_env, "MINIONS_LEASE_AGE_FLOOR_S": "1",
                          "MINIONS_LEASE_AGE_CEILINGS": "*=2", "MINIONS_SWEEP_INTERVAL_S": "0.5"}
    services.workdir.mkdir(parents=True, exist_ok=True)
    services.start("watchdog")
    conn = await connect(services.database_url)
    try:
        task_id = await make_task(conn, subtasks=1)
        hanger = await make_executor(conn, (await make_token(conn, "executor"))[1], name="hanger")
        claim = "SELECT * FROM minion_claim_batch($1, NULL, 1) WHERE verdict = 'leased'"
        beat = "UPDATE heartbeats SET beat_at = now(), seen_at = now() WHERE executor_id = $1"
        for round_ in (1, 2):
            lease = await conn.fetchrow(claim, hanger)
            assert lease is not None, round_

            async def ended() -> bool:
                await conn.execute(beat, hanger)  # it keeps beating
                return await conn.fetchval("SELECT state FROM subtasks WHERE task_id = $1", task_id) == "pending"

            await eventually(ended, "the over-age lease to be ended", timeout_s=30)
            attempt = await conn.fetchrow("SELECT outcome, error FROM subtask_attempts WHERE lease_token = $1",
                                          lease["lease_token"])
            assert attempt["outcome"] == "lost" and "age cap (2 s)" in attempt["error"]
            assert await conn.fetchval("SELECT attempts FROM subtasks WHERE task_id = $1", task_id) == 0
            assert await conn.fetchval("SELECT disagreements FROM executors WHERE id = $1", hanger) == round_
        reason = await conn.fetchval("SELECT quarantine_reason FROM executors WHERE id = $1", hanger)
        assert reason is not None and "age cap" in reason
        refused = await conn.fetch("SELECT verdict FROM minion_claim_batch($1, NULL, 1)", hanger)
        assert [r["verdict"] for r in refused] == ["quarantined"]

        _, vouched_token = await make_token(conn, "executor", trusted=True)
        slow = await make_executor(conn, vouched_token, name="slow")
        lease = await conn.fetchrow(claim, slow)

        async def slow_ended() -> bool:
            await conn.execute(beat, slow)
            return await conn.fetchval("SELECT state FROM subtasks WHERE task_id = $1", task_id) == "pending"

        await eventually(slow_ended, "the vouched executor's over-age lease to be ended", timeout_s=30)
        assert await conn.fetchval("SELECT disagreements FROM executors WHERE id = $1", slow) == 0
        assert lease is not None
    finally:
        await conn.close()
