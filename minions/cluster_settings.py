"""Cluster-wide values (the lease timeout, the max attempts): one home, the minion_settings table.

SQL functions read them there (minion_lease_timeout_s(), minion_max_attempts()), so every process
agrees by construction. A process that needs one in Python (the API tells executors the lease
timeout; the watchdog times its deadlines by it) reads them at start and again on each
NOTIFY minion_settings, which every change sends (sql/schema/02_settings.sql).

They are set by `minions settings set KEY VALUE`, or, for compatibility, by MINIONS_LEASE_TIMEOUT_S /
MINIONS_MAX_ATTEMPTS given to `minions up` or `minions db migrate` (`apply_given`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg

from minions.config import Settings
from minions.db.connect import CONNECTION_ERRORS, connect
from minions.db.gateway import Runs
from minions.db.gateways.cluster_settings import ClusterSettingsGateway
from minions.logging import get_logger

CHANNEL = "minion_settings"
KEYS = ("lease_timeout_s", "max_attempts")
log = get_logger(__name__)


@dataclass(frozen=True)
class ClusterSettings:
    lease_timeout_s: float
    max_attempts: int


async def read(db: Runs) -> ClusterSettings:
    row = await ClusterSettingsGateway(db).read()
    return ClusterSettings(lease_timeout_s=float(row["lease_timeout_s"]), max_attempts=int(row["max_attempts"]))


async def set_value(db: Runs, key: str, value: str) -> str:
    """Store one value (validated in SQL: asyncpg.CheckViolationError names what is wrong)."""
    return await ClusterSettingsGateway(db).set(key=key, value=value)


def given(settings: Settings) -> dict[str, str]:
    """The cluster-wide values a process's environment or flags name (none: leave the rows alone)."""
    values = {"lease_timeout_s": settings.lease_timeout_s, "max_attempts": settings.max_attempts}
    return {key: str(value) for key, value in values.items() if value is not None}


async def apply_given(db: Runs, settings: Settings) -> dict[str, str]:
    """MINIONS_LEASE_TIMEOUT_S / MINIONS_MAX_ATTEMPTS, where given, written to the rows (what was written)."""
    return {key: await set_value(db, key, value) for key, value in given(settings).items()}


async def apply_given_at(database_url: str, settings: Settings) -> dict[str, str]:
    """`apply_given` on its own connection (`minions up`, `minions db migrate`, the test harness)."""
    if not given(settings):
        return {}
    conn = await connect(database_url)
    try:
        return await apply_given(conn, settings)
    finally:
        await conn.close()


class LiveClusterSettings:
    """The API's copy, kept current: a ChannelListener (services/api/leasing/claim_waiters.py) on
    `minion_settings` that re-reads the row on each change and after each (re)LISTEN."""

    channel = CHANNEL

    def __init__(self, pool: asyncpg.Pool, current: ClusterSettings) -> None:
        self._pool = pool
        self._refreshing: set[asyncio.Task[None]] = set()  # held so the loop does not drop them
        self._adopt(current)

    def _adopt(self, current: ClusterSettings) -> None:
        self.current = current
        # Plain attributes, read on every claim and registration.
        self.lease_timeout_s = current.lease_timeout_s
        self.max_attempts = current.max_attempts

    def notified(self, payload: str) -> None:
        self._refresh_soon()

    def listening_changed(self, listening: bool) -> None:
        if listening:  # changes made while the connection was down were not heard
            self._refresh_soon()

    def _refresh_soon(self) -> None:
        task = asyncio.create_task(self.refresh())
        self._refreshing.add(task)
        task.add_done_callback(self._refreshing.discard)

    async def refresh(self) -> None:
        try:
            fresh = await read(self._pool)
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
            log.warning("cluster_settings_unread", error=repr(exc))  # the next (re)LISTEN reads again
            return
        if fresh != self.current:
            log.info("cluster_settings_changed", lease_timeout_s=fresh.lease_timeout_s,
                     max_attempts=fresh.max_attempts)
        self._adopt(fresh)
