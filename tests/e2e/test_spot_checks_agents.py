"""Spot checks with real agents: every subtask checked (MINIONS_SPOT_CHECK_SHARE=1), two agent
processes of two tokens run a sleep task; each result is held until the other agent's replica (a
backup lease to the agent, heartbeated like any) agrees, and the task completes with every subtask
agreed once, nothing held, nobody quarantined, and (two volunteers) neither earning trust."""

from __future__ import annotations

import aiohttp

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.agents import AgentFleet
from minions.testing.factories import make_token
from minions.testing.processes import Services
from minions.testing.waiting import eventually

RECORDS = 12


async def test_two_agents_check_each_other(services: Services) -> None:
    services.extra_env = {**services.extra_env, "MINIONS_SPOT_CHECK_SHARE": "1", "MINIONS_TRUST_AGREEMENTS": "5"}
    await services.start_all()
    conn = await connect(services.database_url)
    admin, _ = await make_token(conn, "admin")
    tokens = [(await make_token(conn, "executor"))[0] for _ in range(2)]
    fleets = [AgentFleet(services, token) for token in tokens]
    try:
        for n, fleet in enumerate(fleets):
            fleet.start(f"checker-{n}", kinds=("sleep",))

        async def registered() -> bool:
            return await conn.fetchval("SELECT count(*) FROM executors WHERE status = 'online'") == 2

        await eventually(registered, "both agents registered", timeout_s=60)
        async with aiohttp.ClientSession() as session, session.post(
                f"{services.api_url}/api/v1/tasks", headers={"Authorization": f"Bearer {admin}"},
                data=jsoncodec.dumps({"team": "search", "project": "trust", "name": "agents", "kind": "sleep",
                                      "subtask_size": 1,
                                      "input": {"records": [{"id": i, "ms": 0} for i in range(RECORDS)]}})) as resp:
            assert resp.status == 201, await resp.text()

        async def completed() -> bool:
            return await conn.fetchval("SELECT status FROM tasks WHERE name = 'agents'") == "completed"

        await eventually(completed, "the task to complete", timeout_s=90)
        outcomes = await conn.fetch("""SELECT subtask_id, array_agg(outcome ORDER BY outcome) AS o
                                         FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
                                        WHERE t.name = 'agents' GROUP BY subtask_id""")
        assert len(outcomes) == RECORDS
        for row in outcomes:
            assert "done" in row["o"] and "agreed" in row["o"], (row, fleets[0].logs(), fleets[1].logs())
            assert "candidate" not in row["o"] and "outvoted" not in row["o"], row
        assert await conn.fetchval("SELECT count(*) FROM executors WHERE quarantined_at IS NOT NULL") == 0
        # Two volunteers agreeing with each other earn no trust: only a trusted voice gives it.
        assert await conn.fetchval("SELECT max(agreements) FROM executors") == 0
        assert await conn.fetchval("SELECT count(*) FROM subtask_checks") == 0
    finally:
        for fleet in fleets:
            fleet.stop_all()
        await conn.close()
