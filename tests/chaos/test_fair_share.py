"""Drill: two teams share one pool (real services, two real agents, the watchdog negotiating every
0.2 s).

Team A submits its bulk of 20 ms subtasks first; team B submits 60 a few seconds later. Under FIFO
B would wait behind all of A. With fair share B completes while A is still running, within twice its
fair time (B's work at half the pool's rate, the rate measured while A ran alone), and while both
have work pending each team wins about half the claims. With weights 3:1 for A, A wins three claims
in four. Then a task whose team's executors are busy with another team's preferred work is warned
`starving`, and loses the warning once it is served. One cluster for the three parts: its start is
most of a short drill's cost.

The shares are counted from the attempts' started_at (the claim's time) over the window in which
both teams had work pending and the negotiation had seen both: from B's first claim to B's last one.

Short form: A has 1,200 subtasks, more than the two agents (about 80 subtasks/s) run through all
three parts (about 500), and is cancelled once the shares are seen. `MINIONS_CHAOS=long`: A has
3,000 and runs to its end.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from minions.testing.cluster import LONG, Cluster, ClusterFactory, eventually, log_events, pick, sleep_records

A_TEAM, B_TEAM, PROJECT = "team-a", "team-b", "drill"
MS = 20
A_SUBTASKS = pick(1200, 3000)
B_SUBTASKS = 60
ALONE_S = 3.0  # A alone before B arrives: "a few seconds", and the window the pool's rate is read in
TOLERANCE = 0.10  # ten points of share
SETTINGS = {"MINIONS_FAIR_SHARE_INTERVAL_S": "0.2", "MINIONS_STARVATION_S": "1"}


def _at(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


async def _submit(cluster: Cluster, team: str, name: str, records: list[dict[str, Any]]) -> None:
    await cluster.client.submit({"team": team, "project": PROJECT, "name": name, "kind": "sleep",
                                 "input": {"records": records}, "subtask_size": 1})


async def _finished(cluster: Cluster, team: str, name: str, timeout: float) -> dict[str, Any]:
    async def finished() -> dict[str, Any] | None:
        task = await cluster.client.task(team, PROJECT, name)
        return task if task["finished_at"] else None

    try:
        return await eventually(finished, f"{team}'s {name} to finish", timeout, interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.logs()}") from None


async def _pool_rate(cluster: Cluster, until: datetime) -> float:
    """Subtasks a second the pool claimed while A ran alone: A's attempts started from A's first
    claim until `until` (B's submission)."""
    conn = await cluster.db()
    try:
        row = await conn.fetchrow(
            """SELECT count(*) AS n, extract(epoch FROM $2::timestamptz - min(a.started_at)) AS span
                 FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
                WHERE t.team = $1 AND a.started_at < $2""", A_TEAM, until)
    finally:
        await conn.close()
    assert row["n"] > 0 and row["span"] > 1.0, dict(row)
    return float(row["n"]) / float(row["span"])


async def _shares(cluster: Cluster, b_task: str) -> tuple[dict[str, int], float]:
    """Claims won by each team between B's first claim and its last (both teams pending), and
    that window's length in seconds."""
    conn = await cluster.db()
    try:
        window = await conn.fetchrow(
            """SELECT min(a.started_at) AS first, max(a.started_at) AS last
                 FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
                WHERE t.team = $1 AND t.project = $2 AND t.name = $3""", B_TEAM, PROJECT, b_task)
        rows = await conn.fetch(
            """SELECT t.team::text AS team, count(*) AS n
                 FROM subtask_attempts a JOIN tasks t ON t.id = a.task_id
                WHERE a.started_at BETWEEN $1 AND $2 GROUP BY t.team""", window["first"], window["last"])
    finally:
        await conn.close()
    return {r["team"]: r["n"] for r in rows}, (window["last"] - window["first"]).total_seconds()


async def _set_weight(cluster: Cluster, team: str, weight: float) -> None:
    conn = await cluster.db()
    try:
        await conn.execute("SELECT minion_set_team_share($1, $2, NULL, NULL)", team, weight)
    finally:
        await conn.close()


HOG = f"{A_TEAM}/{PROJECT}/hog"  # the agents' preference: a task of A's that only the last part submits


async def test_a_late_small_team_gets_its_share_weights_move_it_and_a_starving_task_is_warned(
        make_cluster: ClusterFactory, database_url: str) -> None:
    cluster: Cluster = await make_cluster(database_url, extra_env=SETTINGS)
    await cluster.services.start_all()
    # Both agents prefer A's `hog` task (an owner's choice comes before fairness); it exists only in
    # the starvation part: until then the preference matches nothing and every claim is the pool's.
    for n in range(2):
        cluster.fleet.start(f"agent-{n:02d}", "--prefer", HOG)

    async def registered() -> bool:
        return len([e for e in await cluster.client.executors() if e["status"] != "offline"]) == 2

    await eventually(registered, "2 agents to register", timeout=30)
    await _equal_weights(cluster)
    await _weights_three_to_one(cluster)
    if LONG:  # A's bulk runs to its end: all of it done, none lost to the sharing
        a = await _finished(cluster, A_TEAM, "bulk", timeout=A_SUBTASKS / 10)
        assert a["status"] == "completed" and a["records"]["done"] == A_SUBTASKS, a
    else:  # the short form has seen what it came for
        await cluster.client.cancel(A_TEAM, PROJECT, "bulk")
    await _starving(cluster)
    # Every negotiation ran: a failed one is only logged, and would leave the last turns standing.
    failed = log_events(cluster.services.running["watchdog"].log(), "fair_share_failed")
    assert not failed, failed


async def _equal_weights(cluster: Cluster) -> None:
    """A's bulk first, B's 60 a few seconds later: B completes while A runs, within twice its fair
    time, half the claims each while both are pending."""
    await _submit(cluster, A_TEAM, "bulk", sleep_records(A_SUBTASKS, MS, prefix="a"))
    await asyncio.sleep(ALONE_S)
    await _submit(cluster, B_TEAM, "equal", sleep_records(B_SUBTASKS, MS, prefix="b"))
    b = await _finished(cluster, B_TEAM, "equal", timeout=120)
    a = await cluster.client.task(A_TEAM, PROJECT, "bulk")
    assert b["status"] == "completed", b
    assert a["finished_at"] is None and a["records"]["done"] < A_SUBTASKS, a["records"]

    rate = await _pool_rate(cluster, _at(b["created_at"]))
    # B's fair time: its subtasks at half the pool's rate.
    fair_s = B_SUBTASKS / (rate / 2)
    took_s = (_at(b["finished_at"]) - _at(b["created_at"])).total_seconds()
    equal, equal_s = await _shares(cluster, "equal")
    b_share = equal.get(B_TEAM, 0) / sum(equal.values())
    print(f"pool {rate:.1f} subtasks/s with A alone; B's {B_SUBTASKS} took {took_s:.2f} s, fair time {fair_s:.2f} s; "
          f"claims while both pending ({equal_s:.2f} s): {equal} (B {b_share:.0%})")
    assert took_s <= 2 * fair_s, (took_s, fair_s)
    assert abs(b_share - 0.5) <= TOLERANCE, equal


async def _weights_three_to_one(cluster: Cluster) -> None:
    """Weights 3:1 for A (also the team with far more recent usage, so usage alone would favour B):
    B now wins one claim in four."""
    await _set_weight(cluster, A_TEAM, 3)
    await _submit(cluster, B_TEAM, "weighted", sleep_records(B_SUBTASKS, MS, prefix="w"))
    b = await _finished(cluster, B_TEAM, "weighted", timeout=120)
    a = await cluster.client.task(A_TEAM, PROJECT, "bulk")
    assert b["status"] == "completed", b
    assert a["finished_at"] is None, a["records"]
    weighted, weighted_s = await _shares(cluster, "weighted")
    b_share = weighted.get(B_TEAM, 0) / sum(weighted.values())
    took_s = (_at(b["finished_at"]) - _at(b["created_at"])).total_seconds()
    print(f"weights 3:1 for A: B's {B_SUBTASKS} took {took_s:.2f} s; claims while both pending "
          f"({weighted_s:.2f} s): {weighted} (B {b_share:.0%}); A done {a['records']['done']} of {A_SUBTASKS}")
    assert abs(b_share - 0.25) <= TOLERANCE, weighted


async def _starving(cluster: Cluster) -> None:
    """B's task waits while both agents run A's preferred `hog`: warned `starving` after
    MINIONS_STARVATION_S (1 s), and the warning goes once B is served, while B still runs."""
    await _submit(cluster, A_TEAM, "hog", sleep_records(16, 500, prefix="h"))  # 4 s of the two agents
    await _submit(cluster, B_TEAM, "waiting", sleep_records(150, MS, prefix="s"))
    submitted = time.monotonic()

    async def starving() -> dict[str, Any] | None:
        task = await cluster.client.task(B_TEAM, PROJECT, "waiting")
        return task if any(w["code"] == "starving" for w in task["warnings"]) else None

    warned = await eventually(starving, "B's task to be warned starving", timeout=10, interval=0.1)
    warned_s = time.monotonic() - submitted
    assert warned["records"]["done"] == 0 and warned["finished_at"] is None, warned
    hog = await cluster.client.task(A_TEAM, PROJECT, "hog")
    assert hog["finished_at"] is None, hog["records"]

    # Once the hog's work is out, B is served: the warning goes while B still runs (a finished task
    # shows none anyway).
    async def served() -> dict[str, Any] | None:
        task = await cluster.client.task(B_TEAM, PROJECT, "waiting")
        if task["finished_at"] is not None:
            raise AssertionError(f"B finished before its warning was seen to go: {task}")
        fed = task["records"]["done"] > 0 and not [w for w in task["warnings"] if w["code"] == "starving"]
        return task if fed else None

    await eventually(served, "B's starving warning to go once it is served", timeout=30, interval=0.05)
    served_s = time.monotonic() - submitted
    b = await _finished(cluster, B_TEAM, "waiting", timeout=60)
    assert b["status"] == "completed", b
    print(f"starving: warned {warned_s:.2f} s after submission, served and cleared at {served_s:.2f} s")
