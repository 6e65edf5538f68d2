"""The watchdog's one door to the database: every statement of `sql/queries/watchdog.sql`, wrapped
once with keyword arguments and a typed result (the base is minions/db/gateway.py). The SQL
functions (sql/schema/06_leases.sql and on) re-check what they are asked under row locks: the
watchdog's clock never decides alone, and a method is a translation, never a decision."""

from __future__ import annotations

import uuid
from typing import TypedDict

from minions.db.gateway import Gateway
from minions.db.queries import Queries


class HolderRow(TypedDict):
    """An executor's leases and the seconds left before its silence counts as lost."""

    leases: int
    remaining_s: float


class WatchdogGateway(Gateway):
    queries = Queries("watchdog")

    # ---- leases

    async def lease_holders(self) -> dict[uuid.UUID, float]:
        """Each executor holding a lease, with the seconds left before its silence counts as lost (at
        the cluster's lease timeout)."""
        return {row["executor_id"]: row["remaining_s"] for row in await self.db.fetch(self.queries.lease_holders)}

    async def holder_remaining(self, *, executor_id: uuid.UUID) -> HolderRow | None:
        """None for an executor with no heartbeat row."""
        row: HolderRow | None = await self.db.fetchrow(self.queries.holder_remaining, executor_id)
        return row

    async def reclaim_executor(self, *, executor_id: uuid.UUID) -> int:
        """Reclaims the executor's leases if it is silent past the lease timeout: the subtasks reclaimed."""
        reclaimed: int = await self.db.fetchval(self.queries.reclaim_executor, executor_id)
        return reclaimed

    async def reclaim_expired(self) -> int:
        """The same for every silent executor: the subtasks reclaimed."""
        reclaimed: int = await self.db.fetchval(self.queries.reclaim_expired)
        return reclaimed

    async def end_overage_leases(self, *, factor: float, floor_s: float, ceilings: str, quarantine_after: int) -> int:
        """Ends leases and replicas held past their age cap, heartbeats or not: how many."""
        ended: int = await self.db.fetchval(self.queries.end_overage_leases, factor, floor_s, ceilings,
                                            quarantine_after)
        return ended

    # ---- model pins

    async def unpin_idle_tasks(self) -> int:
        """Releases the model pins that hold nothing any more: the tasks unpinned."""
        unpinned: int = await self.db.fetchval(self.queries.unpin_idle_tasks)
        return unpinned

    async def release_orphan_pins(self, *, after_s: float) -> int:
        """Releases the pins no online executor has reported for `after_s` while work waits: the tasks."""
        released: int = await self.db.fetchval(self.queries.release_orphan_pins, after_s)
        return released

    # ---- spot checks

    async def settle_stale_checks(self, *, wait_s: float) -> int:
        """Ends the spot checks that could not finish within `wait_s`: the subtasks."""
        settled: int = await self.db.fetchval(self.queries.settle_stale_checks, wait_s)
        return settled

    async def settle_quarantines(self) -> int:
        """The rest of each quarantine a vote flagged: the subtasks run again."""
        rerun: int = await self.db.fetchval(self.queries.settle_quarantines)
        return rerun

    # ---- fair share

    async def fair_share_cycle(self, *, half_life_s: float, turns_per_round: int,
                               starving_s: float) -> int | None:
        """One negotiation between teams; None when another watchdog holds it."""
        result: int | None = await self.db.fetchval(self.queries.fair_share_cycle, half_life_s, turns_per_round,
                                                    starving_s)
        return result

    async def fair_share_off(self) -> None:
        """No turns: claims take priority, then FIFO."""
        await self.db.execute(self.queries.fair_share_off)
