"""The watchdog: LISTENs on `heartbeats` (minions/db/listen.py), keeps deadlines only for executors
holding a lease, and when one passes asks SQL to reclaim (which re-checks the silence under a row
lock, so our clock never decides alone). It also sweeps on start, after every (re)LISTEN, after
every reconnect and on a timer: a NOTIFY is a wake-up, never the only record of work.

The lease timeout is the cluster's (minion_settings, read by the SQL functions): the watchdog reads
it at each sweep, and a change (NOTIFY minion_settings, heard on the same LISTEN connection) asks
for a sweep at once, so deadlines follow a new timeout without a restart.

The LISTEN connection is the listener's own; the sweeps and reclaims run on a second connection,
so the listener's liveness probe never races them for it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg

from minions import cluster_settings
from minions.backoff import Backoff
from minions.config import Settings
from minions.db.connect import CONNECTION_ERRORS, connect
from minions.db.listen import Listener
from minions.logging import get_logger
from minions.result_parts import compact_completed
from minions.retention import run_retention
from minions.services.watchdog.deadlines import Deadlines
from minions.services.watchdog.gateway import WatchdogGateway
from minions.spot_check_settings import spot_check_session
from minions.store.base import StoreError
from minions.store_gc import GcReport, collect_garbage, connected_store

log = get_logger(__name__)
CHANNEL = "heartbeats"


class Watchdog:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.deadlines = Deadlines()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._catch_up = False  # set by each (re)LISTEN: heartbeats may have gone unheard
        self.lease_timeout_s: float | None = None  # the cluster's, read at each sweep
        self.listener = Listener(settings.database_url, CHANNEL, self._on_heartbeat, catch_up=self._caught_up,
                                 probe_interval_s=settings.listen_probe_s,
                                 also={cluster_settings.CHANNEL: lambda _key: self._caught_up()})
        self.reclaimed_total = 0

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        listening = asyncio.create_task(self.listener.run(), name="watchdog-listen")
        gc = asyncio.create_task(self._gc_loop(), name="watchdog-gc")
        retention = asyncio.create_task(self._retention_loop(), name="watchdog-retention")
        compaction = asyncio.create_task(self._compact_loop(), name="watchdog-compact")
        negotiation = asyncio.create_task(self._fair_share_loop(), name="watchdog-fair-share")
        try:
            await self._judge()
        finally:
            for task in (negotiation, compaction, retention, gc, listening):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _gc_loop(self) -> None:
        """The object store's garbage collection (minions.store_gc), every MINIONS_GC_INTERVAL_S; off
        without a store or with an interval of 0. A failed sweep is logged and tried again next time."""
        interval = self.settings.gc_interval_s
        if not self.settings.store or interval <= 0:
            log.info("gc_off", reason="no MINIONS_STORE" if not self.settings.store else "interval 0")
            return
        async for _ in self._ticks(interval):
            try:
                report = await self._collect_garbage()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, StoreError, ValueError) as exc:
                log.warning("gc_failed", error=str(exc))
                continue
            if report.freed_bytes or report.errors or report.kept.objects:
                log.info("gc_swept", freed_bytes=report.freed_bytes, inputs=report.inputs.objects,
                         outputs=report.outputs.objects, partial_writes=report.partials.objects,
                         kept_results_dropped=report.kept.objects, kept_bytes_dropped=report.kept.bytes,
                         errors=report.errors)

    async def _retention_loop(self) -> None:
        """The retention job (minions.retention) every MINIONS_RETENTION_INTERVAL_S, first one interval
        after start; off with MINIONS_RETENTION_DAYS=0. Of several watchdogs, one runs it at a time."""
        if self.settings.retention_days <= 0:
            log.info("retention_off", reason="MINIONS_RETENTION_DAYS=0")
            return
        async for _ in self._ticks(self.settings.retention_interval_s):
            try:
                conn = await connect(self.settings.database_url)
                try:
                    await run_retention(conn, self.settings.retention_days, should_stop=self._stopping.is_set)
                finally:
                    await conn.close()
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                log.warning("retention_failed", error=str(exc))

    async def _collect_garbage(self) -> GcReport:
        async with connected_store(self.settings.database_url, self.settings.store,
                                   self.settings.s3_endpoint_url) as (conn, store):
            return await collect_garbage(conn, store, grace_s=self.settings.gc_grace_s)

    async def _compact_loop(self) -> None:
        """Completed tasks' results compacted into parts (minions.result_parts), every
        MINIONS_COMPACT_INTERVAL_S; off without a store or with an interval of 0. A failed run is
        logged and resumed next time after the parts it recorded."""
        interval = self.settings.compact_interval_s
        if not self.settings.store or interval <= 0:
            return
        async for _ in self._ticks(interval):
            try:
                async with connected_store(self.settings.database_url, self.settings.store,
                                           self.settings.s3_endpoint_url) as (conn, store):
                    await compact_completed(conn, store, part_bytes=self.settings.result_part_bytes)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, StoreError, ValueError) as exc:
                log.warning("compaction_failed", error=str(exc))

    async def _fair_share_loop(self) -> None:
        """Whose turn it is between teams sharing a queue, every MINIONS_FAIR_SHARE_INTERVAL_S
        (minion_fair_share_cycle: usage folded, turns written, capped teams with room woken, starving
        tasks noted). 0 turns it off and clears the turns. On one connection kept open between
        negotiations; a failed one is logged and the next tries afresh."""
        interval = self.settings.fair_share_interval_s
        conn: asyncpg.Connection | None = None
        try:
            if interval <= 0:
                with contextlib.suppress(*CONNECTION_ERRORS, asyncpg.PostgresError):
                    conn = await connect(self.settings.database_url)
                    await WatchdogGateway(conn).fair_share_off()
                log.info("fair_share_off", reason="MINIONS_FAIR_SHARE_INTERVAL_S=0")
                return
            async for _ in self._ticks(interval):
                try:
                    if conn is None or conn.is_closed():
                        conn = await connect(self.settings.database_url)
                    await WatchdogGateway(conn).fair_share_cycle(
                        half_life_s=self.settings.fair_share_half_life_s,
                        turns_per_round=self.settings.fair_share_round, starving_s=self.settings.starvation_s)
                except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                    log.warning("fair_share_failed", error=str(exc))
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            await conn.close()
                    conn = None
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()

    async def _ticks(self, interval: float) -> AsyncIterator[None]:
        """One tick every `interval` seconds, until the watchdog stops."""
        while not self._stopping.is_set():
            await self._sleep(interval)
            if self._stopping.is_set():
                return
            yield

    async def _judge(self) -> None:
        backoff = Backoff(max_s=5.0)
        reconnecting = False
        while not self._stopping.is_set():
            try:
                # The spot-check settings: ending a volunteer's attempt reads them (sql/schema/06_leases.sql).
                conn = await connect(self.settings.database_url, server_settings=spot_check_session(self.settings))
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                delay = backoff.next_delay()
                log.warning("database_unreachable", error=str(exc), retry_in_s=round(delay, 2))
                await self._sleep(delay)
                continue
            backoff.reset()
            try:
                # Back from an outage: no executor could heartbeat meanwhile, so every lease looks
                # silent. Give them a lease timeout to get a heartbeat through before judging.
                self.lease_timeout_s = (await cluster_settings.read(conn)).lease_timeout_s
                await self._serve(conn, grace_s=self.lease_timeout_s if reconnecting else 0.0)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                log.warning("database_connection_lost", error=str(exc))
                reconnecting = True
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 2)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _caught_up(self) -> None:
        self._catch_up = True
        self._wake.set()

    async def _serve(self, conn: asyncpg.Connection, grace_s: float) -> None:
        lost = asyncio.Event()

        def on_lost(_conn: object) -> None:
            lost.set()
            self._wake.set()

        conn.add_termination_listener(on_lost)
        log.info("judging", lease_timeout_s=self.lease_timeout_s, grace_s=grace_s)
        judge_from = asyncio.get_running_loop().time() + grace_s
        next_sweep = judge_from
        while not self._stopping.is_set() and not lost.is_set():
            loop_now = asyncio.get_running_loop().time()
            if self._catch_up:
                self._catch_up = False
                next_sweep = min(next_sweep, max(loop_now, judge_from))
            if loop_now >= next_sweep:
                await self._sweep(conn)
                next_sweep = loop_now + self.settings.sweep_interval_s
            if loop_now >= judge_from:
                for executor_id in self.deadlines.due():
                    await self._reclaim(conn, executor_id)
            to_next = self.deadlines.seconds_to_next()  # 0.0 is a deadline due now, not "none"
            if to_next is not None:
                to_next = max(to_next, judge_from - loop_now)
            timeout = min(float("inf") if to_next is None else to_next, next_sweep - loop_now)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.01, timeout))
        if lost.is_set():
            raise ConnectionError("database connection closed")

    def _on_heartbeat(self, payload: str) -> None:
        executor_raw, _, leases_raw = payload.partition(" ")
        try:
            executor_id, leases = uuid.UUID(executor_raw), int(leases_raw)
        except ValueError:
            log.warning("bad_heartbeat_payload", payload=payload)
            return
        if leases > 0 and self.lease_timeout_s is not None:  # None: not yet connected, the first sweep tracks it
            self.deadlines.track(executor_id, self.lease_timeout_s)
        else:
            self.deadlines.forget(executor_id)
        self._wake.set()

    async def _sweep(self, conn: asyncpg.Connection) -> None:
        db = WatchdogGateway(conn)
        current = await cluster_settings.read(conn)
        if current.lease_timeout_s != self.lease_timeout_s:
            log.info("lease_timeout_changed", lease_timeout_s=current.lease_timeout_s)
            self.lease_timeout_s = current.lease_timeout_s
        reclaimed = await db.reclaim_expired()
        self._count(reclaimed, "sweep")
        if unpinned := await db.unpin_idle_tasks():
            log.info("model_pins_released", tasks=unpinned)
        if orphaned := await db.release_orphan_pins(after_s=self.settings.pin_release_s):
            log.warning("orphan_model_pins_released", tasks=orphaned, after_s=self.settings.pin_release_s)
        settings = self.settings
        if overage := await db.end_overage_leases(factor=settings.lease_age_factor, floor_s=settings.lease_age_floor_s,
                                                  ceilings=settings.lease_age_ceilings,
                                                  quarantine_after=settings.quarantine_after):
            log.warning("leases_ended_over_age", leases=overage)
        if stale := await db.settle_stale_checks(wait_s=self.settings.spot_check_wait_s):
            log.warning("spot_checks_ended_unfinished", subtasks=stale, wait_s=self.settings.spot_check_wait_s)
        if rerun := await db.settle_quarantines():
            log.warning("quarantines_settled", subtasks_rerun=rerun)
        self.deadlines.replace_all(await db.lease_holders())

    async def _reclaim(self, conn: asyncpg.Connection, executor_id: uuid.UUID) -> None:
        db = WatchdogGateway(conn)
        reclaimed = await db.reclaim_executor(executor_id=executor_id)
        if reclaimed:
            self._count(reclaimed, "deadline", executor_id=str(executor_id))
            self.deadlines.forget(executor_id)
            return
        # Not silent after all (a heartbeat we have not heard yet), or no lease left: re-read.
        row = await db.holder_remaining(executor_id=executor_id)
        if row is None or row["leases"] == 0:
            self.deadlines.forget(executor_id)
        else:
            self.deadlines.track(executor_id, row["remaining_s"])

    def _count(self, reclaimed: int, why: str, **fields: str) -> None:
        if reclaimed:
            self.reclaimed_total += reclaimed
            log.warning("leases_reclaimed", subtasks=reclaimed, trigger=why, **fields)
