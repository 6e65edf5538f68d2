"""Two hostile volunteers written from docs/API.md, beside two honest agents (real processes, their
token vouched for): a hanger that claims and heartbeats but never completes (it held a task open for
15 minutes), and a snoop that claims whatever it may. The hanger's leases end at the age cap
(MINIONS_LEASE_AGE_*: 3 s here, nothing measured yet), heartbeats or not; the second time it is
quarantined, and the task completes on the honest agents: the leases it drops from its heartbeats
(lost) count once towards the subtask's attempts, so it cannot fail the task either. A task placed
`trusted` never reaches either of them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

import aiohttp

from minions.testing.factories import make_token
from minions.testing.waiting import eventually
from tests.e2e.test_agent_e2e import cluster


class Volunteer:
    """A volunteer executor over the plain HTTP API that claims sleep subtasks and, when `hangs`,
    heartbeats its leases without ever completing them; otherwise it just records what it was given."""

    def __init__(self, api_url: str, token: str, name: str, hangs: bool) -> None:
        self.api_url, self.token, self.name, self.hangs = api_url, token, name, hangs
        self.executor_id = ""
        self.tasks_seen: set[str] = set()
        self.held: list[str] = []
        self.refusal: dict[str, Any] | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def run(self, session: aiohttp.ClientSession) -> None:
        async with session.post(f"{self.api_url}/api/v1/executors/register", headers=self._headers(), json={
                "name": self.name, "hardware": {"os": "drill"}, "kinds": ["sleep"], "models": [],
                "preferences": []}) as reply:
            assert reply.status == 201, await reply.text()
            self.executor_id = (await reply.json())["executor_id"]
        beat = asyncio.create_task(self._beat(session))
        try:
            while self.refusal is None:
                async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/claim?wait=1&max=2",
                                        headers=self._headers()) as reply:
                    if reply.status == 403:
                        self.refusal = (await reply.json())["error"]
                        return
                    if reply.status != 200:
                        continue
                    leases = (await reply.json())["leases"]
                for lease in leases:
                    self.tasks_seen.add(lease["subtask"]["task_name"])
                    self.held.append(lease["lease"]["token"])
                if not self.hangs:  # hands them back: only what it was given matters
                    async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/release",
                                            headers=self._headers(), json={"leases": self.held}):
                        self.held = []
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _beat(self, session: aiohttp.ClientSession) -> None:
        while True:
            async with session.post(f"{self.api_url}/api/v1/executors/{self.executor_id}/heartbeat",
                                    headers=self._headers(), json={"leases": self.held[-256:]}) as reply:
                if reply.status == 200:
                    states = (await reply.json())["leases"]
                    self.held = [t for t in self.held if states.get(t) == "ok"]
            await asyncio.sleep(0.3)


async def test_a_hanger_cannot_hold_a_task_and_a_trusted_task_never_reaches_a_volunteer(
        database_url: str, tmp_path: Path) -> None:
    # The production defaults of the spot checks (the harness turns them off): volunteers are told apart.
    env = {"MINIONS_LEASE_AGE_FLOOR_S": "1", "MINIONS_LEASE_AGE_CEILINGS": "*=3", "MINIONS_QUARANTINE_AFTER": "2",
           "MINIONS_SPOT_CHECK_SHARE": "0.02", "MINIONS_TRUST_AGREEMENTS": "5"}
    async with cluster(database_url, tmp_path, extra_env=env) as c:
        for name in ("honest-1", "honest-2"):
            c.agent(name=name)
        await c.registered("honest-1", "honest-2")
        hanger = Volunteer(c.services.api_url, (await make_token(c.conn, "executor"))[0], "hanger", hangs=True)
        snoop = Volunteer(c.services.api_url, (await make_token(c.conn, "executor"))[0], "snoop", hangs=False)
        async with aiohttp.ClientSession() as session:
            runs = [asyncio.create_task(v.run(session)) for v in (hanger, snoop)]
            try:
                # The honest agents busy elsewhere for a moment: the hanger gets the first leases.
                for agent in c.fleet.agents:
                    agent.process.send_signal(signal.SIGSTOP)
                try:
                    # A stopped agent's long poll already in the API would still be served: let them end.
                    await asyncio.sleep(c.services.long_poll_s + 1)
                    await c.submit("hung", "sleep", [{"id": i, "ms": 50} for i in range(8)], subtask_size=1)

                    async def holds() -> bool:
                        return len(hanger.held) >= 1

                    await eventually(holds, "the hanger to hold a lease", timeout_s=30)
                finally:
                    for agent in c.fleet.agents:
                        agent.process.send_signal(signal.SIGCONT)
                await c.submit("secret", "sleep", [{"id": i, "ms": 50} for i in range(8)], subtask_size=1,
                               placement="trusted")
                for name in ("hung", "secret"):
                    task = await c.status(name, "completed", "failed", "cancelled", timeout_s=60)
                    assert task["status"] == "completed", (task["error"], task)

                async def quarantined() -> bool:
                    return hanger.refusal is not None

                # It keeps claiming what it let go of (pending again at the head of the queue) until
                # its second lease past the cap quarantines it; the task did not wait for it.
                await c.submit("bait", "sleep", [{"id": i, "ms": 50} for i in range(40)], subtask_size=1)
                await eventually(quarantined, "the hanger to be quarantined", timeout_s=60)
            finally:
                for run in runs:
                    run.cancel()
                await asyncio.gather(*runs, return_exceptions=True)
        assert hanger.refusal is not None and hanger.refusal["code"] == "quarantined"
        assert "age cap" in hanger.refusal["message"], hanger.refusal
        ended = await c.conn.fetch(
            """SELECT a.outcome, a.error FROM subtask_attempts a JOIN executors e ON e.id = a.executor_id
                WHERE e.name = 'hanger'""")
        # (A lease claimed between two of its heartbeats may end first as unnamed: the protocol's own rule;
        # those it holds when quarantined are released.)
        assert all(r["outcome"] in ("lost", "released") for r in ended), ended
        assert sum("age cap" in r["error"] for r in ended) >= 2, ended
        assert "secret" not in hanger.tasks_seen | snoop.tasks_seen
        assert snoop.tasks_seen, "the snoop took part"
        listed = {e["name"]: e["trust"] for e in await c.client.executors()}
        assert listed["honest-1"]["disagreements"] == listed["honest-2"]["disagreements"] == 0
