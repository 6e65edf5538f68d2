"""The watchdog's sweep ends what spot checks cannot end by themselves (real watchdog process): a held
result no replica judged within MINIONS_SPOT_CHECK_WAIT_S commits unchecked, and a quarantine a vote
flagged but left unsettled (the API died before settling it) is settled: its executor's leases
released."""

from __future__ import annotations

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token
from minions.testing.processes import Services
from minions.testing.waiting import eventually


async def test_the_sweep_ends_stale_checks_and_settles_quarantines(services: Services) -> None:
    services.extra_env = {**services.extra_env, "MINIONS_SPOT_CHECK_WAIT_S": "1"}
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

        async def committed_unchecked() -> bool:
            return await conn.fetchval(
                "SELECT outcome FROM subtask_attempts WHERE lease_token = $1", held["lease_token"]) == "unchecked"

        async def settled() -> bool:
            return await conn.fetchval("SELECT quarantine_settled FROM executors WHERE id = $1", b)

        await eventually(committed_unchecked, "the stale check to commit unchecked", timeout_s=30)
        await eventually(settled, "the quarantine to be settled", timeout_s=30)
        assert await conn.fetchval("SELECT state FROM subtasks WHERE lease_token = $1", held["lease_token"]) == "done"
        # The replica was released by the quarantine (or dropped by the stale check): it counts for nothing.
        assert await conn.fetchval("SELECT minion_complete($1, 1, 0.01)", replica["lease_token"]) == "lost"
        assert await conn.fetchval("SELECT count(*) FROM subtasks WHERE task_id = $1 AND state = 'done'",
                                   task_id) == 1
    finally:
        await conn.close()
