"""What `minions verify` re-runs (minion_verify_task, sql/schema/11_checks.sql): a result is suspect when it
came from an executor quarantined since, was committed unchecked, or is a volunteer's that no vouched
executor agreed with (a stranger's word, or none); the verification task runs on vouched executors only."""

from __future__ import annotations

from minions.db.connect import connect
from minions.testing.factories import make_executor, make_task, make_token

CLAIM = "SELECT * FROM minion_claim_batch($1, NULL, 1) WHERE verdict = 'leased'"
COMPLETE = "SELECT minion_complete($1, 1, 0.01, NULL, NULL, NULL, NULL)"
VOTE = "SELECT minion_check_vote($1, 1, 0.01, NULL, NULL, NULL, NULL, NULL, $2::smallint)"


async def test_volunteer_only_and_unchecked_results_are_suspect(database_url: str) -> None:
    conn = await connect(database_url)
    try:
        await conn.execute("SET minions.spot_check_share = '0'")
        await conn.execute("SET minions.trust_agreements = '0'")
        task_id = await make_task(conn, subtasks=3)
        _, volunteer_token = await make_token(conn, "executor")
        _, vouched_token = await make_token(conn, "executor", trusted=True)
        volunteer = await make_executor(conn, volunteer_token, name="volunteer")
        vouched = await make_executor(conn, vouched_token, name="vouched")
        # 0: a volunteer's, checked by nobody (checks off) — suspect.
        lease = await conn.fetchrow(CLAIM, volunteer)
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
        # 1: a vouched executor's — not suspect.
        lease = await conn.fetchrow(CLAIM, vouched)
        assert await conn.fetchval(COMPLETE, lease["lease_token"]) == "ok"
        vouched_lease = lease["lease_token"]
        # 2: a volunteer's, held and agreed with by the vouched executor — not suspect.
        await conn.execute("SET minions.spot_check_share = '1'")
        await conn.execute("SET minions.trust_agreements = '1'")
        held = await conn.fetchrow(CLAIM, volunteer)
        assert await conn.fetchval(COMPLETE, held["lease_token"]) == "held"
        replica = await conn.fetchrow(CLAIM, vouched)
        assert await conn.fetchval(VOTE, replica["lease_token"], 1) == "agreed"
        assert await conn.fetchval("SELECT status FROM tasks WHERE id = $1", task_id) == "completed"

        made = await conn.fetchrow("SELECT * FROM minion_verify_task($1, 'again', false, NULL)", task_id)
        assert made["subtasks"] == 1
        assert await conn.fetchval("SELECT placement FROM tasks WHERE id = $1", made["task_id"]) == "trusted"
        assert await conn.fetchval("SELECT array_agg(first_record) FROM subtasks WHERE task_id = $1",
                                   made["task_id"]) == [0]
        # Committed unchecked (a vouched candidate past the wait is the one way left) is suspect too.
        await conn.execute("UPDATE subtask_attempts SET outcome = 'unchecked' WHERE lease_token = $1", vouched_lease)
        made = await conn.fetchrow("SELECT * FROM minion_verify_task($1, 'again2', false, NULL)", task_id)
        assert made["subtasks"] == 2
        # The verification runs on vouched executors only: the volunteer passes over it.
        assert await conn.fetch(CLAIM, volunteer) == []
        assert (await conn.fetchrow(CLAIM, vouched))["task_id"] in {made["task_id"]} | {
            await conn.fetchval("SELECT id FROM tasks WHERE name = 'again'")}
    finally:
        await conn.close()
