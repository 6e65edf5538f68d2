"""The claim: a long poll that wins up to `most` leases for an executor, and the answer that tells it
what to run (inputs inline or by signed URL, output URLs, what a replica checks).

One statement per try (minion_claim_batch: the executor check and up to `most` claims), and none while
waiting: the waiter is registered before the first query (woken by NOTIFY through claim_waiters.py),
and a wait that times out answers nothing without asking again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from minions import protocol
from minions.logging import get_logger
from minions.services.api.context import Context
from minions.services.api.gateway import ClaimRow
from minions.services.api.http.errors import forbidden
from minions.services.api.leasing import spot_check
from minions.services.api.leasing.input_cache import InputCache
from minions.services.api.leasing.leases import refuse_executor
from minions.store.base import ObjectStore, StoreError

log = get_logger(__name__)
# Output URLs outlive any lease a heartbeating executor can hold in practice; they are keyed per
# attempt, so a late writer cannot harm a committed result (invariant 4). An input URL lasts the lease
# timeout plus MINIONS_INPUT_URL_MARGIN_S and is renewed by each heartbeat (`input_url_s`).
URL_LIFETIME_S = 12 * 3600.0


async def claim(ctx: Context, executor_id: uuid.UUID, token_id: int | None, *, most: int, wait_s: float,
                batched: bool, params_once: bool,
                hung_up: Callable[[], bool]) -> protocol.Lease | protocol.LeaseBatch | None:
    """The leases won within `wait_s`, as one Lease (a claim without `max`: the first protocol's answer)
    or a LeaseBatch; None when none came (or the process is shutting down, or the client hung up).
    `token_id`: the caller's API token the SQL checks the executor against (None: an admin)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    waiters = ctx.waiters
    # Registered before the first query (woken by anything until the executor's capabilities are
    # known), so a notification landing during a query is not missed.
    with waiters.registered() as waiter:
        while True:
            # aiohttp lets a handler run on after its client hung up: a long poll of an executor
            # that died (kill -9, crash) must not win a lease nobody will ever hear of. (After a
            # quick restart under the same name that lease would never be reclaimed: the new
            # process keeps the executor's heartbeat fresh.)
            if hung_up():
                return None
            rows = await ctx.gateway.claim_batch(executor_id=executor_id, token_id=token_id, most=most,
                                                 straggler_factor=ctx.settings.straggler_factor)
            verdict = rows[0]["verdict"]
            if verdict == "leased":
                return await _answer(ctx, rows, batched=batched, params_once=params_once, hung_up=hung_up)
            if verdict == "quarantined":  # sql/schema/11_checks.sql: its results lost quorums
                reason = await ctx.gateway.quarantine_reason(executor_id=executor_id)
                raise forbidden(f"this executor is quarantined: {reason}; an admin may release it "
                                "(minions executor release)", "quarantined")
            refuse_executor(verdict, executor_id)
            waiter.capabilities = frozenset(rows[0]["capabilities"])
            remaining = deadline - loop.time()
            # A process shutting down answers at once (ClaimWaiters.close), before and after a wait.
            if waiters.closing or remaining <= 0 or not await waiter.wait(remaining) or waiters.closing:
                return None


async def _answer(ctx: Context, rows: list[ClaimRow], *, batched: bool, params_once: bool,
                  hung_up: Callable[[], bool]) -> protocol.Lease | protocol.LeaseBatch | None:
    """The leases won, as the executor is told of them (each task's params sent once with
    `params_once`); handed back at once when the executor cannot be told."""
    try:
        if hung_up():
            raise ConnectionResetError
        inputs = await _inline_inputs(ctx.store, ctx.inputs, rows, ctx.settings.inline_input_bytes)
        if any(row["input_uri"] is None and data is None for row, data in zip(rows, inputs, strict=True)):
            # The claim's statement read every kept range (minion_kept_input sees what the claim saw):
            # none means the task was deleted meanwhile, as when a store read fails.
            raise StoreError("the kept input of a task claimed is gone")
        checks = await _replica_checks(ctx, rows)
        leases = await asyncio.gather(*(_lease(ctx, row, data, checks.get(row["lease_token"]))
                                        for row, data in zip(rows, inputs, strict=True)))
    except (StoreError, ConnectionResetError):
        # The claim committed but the executor cannot be told: hand it back now rather than leave
        # it to the watchdog (the executor keeps heartbeating).
        for row in rows:
            await ctx.gateway.release(lease_token=row["lease_token"])
        if hung_up():
            return None
        raise
    for row, data in zip(rows, inputs, strict=True):
        ctx.leases.remember(row, data)
    if not batched:
        return leases[0]
    batch = protocol.LeaseBatch(leases=leases)
    return batch.sharing_params() if params_once else batch


def input_url_s(ctx: Context) -> float:
    """How long an input URL handed out now works: as long as the lease would without another
    heartbeat, plus the margin (clock skew between this host and the store, a GET begun at the end)."""
    return ctx.cluster.lease_timeout_s + ctx.settings.input_url_margin_s


async def _replica_checks(ctx: Context, rows: list[ClaimRow]) -> dict[Any, protocol.CheckRef]:
    """What each completion lease that is a spot check's replica checks: the held results, whose
    proofs of generation it verifies instead of generating (agents' transformers backend). Other
    kinds are compared as they come, and are not told."""
    tokens = [row["lease_token"] for row in rows if row["kind"] == "completion"]
    if not tokens:
        return {}
    held: dict[Any, list[str]] = {}
    for row in await ctx.gateway.replica_checks(lease_tokens=tokens):
        try:
            output = await spot_check.held_bytes(ctx.store, row)
        except StoreError as exc:  # ResultCorrupted included
            # Not readable: not sent; the replica generates its own result, compared as any.
            log.warning("held_result_unreadable", lease=str(row["lease_token"]), error=str(exc))
            continue
        held.setdefault(row["lease_token"], []).append(output.decode())
    return {token: protocol.CheckRef(outputs=outputs) for token, outputs in held.items()}


async def _lease(ctx: Context, row: ClaimRow, data: bytes | None,
                 check: protocol.CheckRef | None = None) -> protocol.Lease:
    store = ctx.store
    lifetime = max(URL_LIFETIME_S, 2 * ctx.cluster.lease_timeout_s)
    start, end = row["byte_start"], row["byte_end"]
    return protocol.Lease(
        lease=protocol.LeaseTerms(token=str(row["lease_token"]), expires_at=row["expires_at"].isoformat(),
                                  backup=row["backup"]),
        subtask=protocol.LeasedSubtask(
            team=row["team"], project=row["project"], task_name=row["task_name"], subtask_id=row["subtask_id"],
            attempt=row["attempt"], kind=row["kind"], model=row["model"], params=row["params"],
            # A kept input (sql/schema/08_inputs.sql) has no object to GET: its range always rides inline. An
            # object's URL reads this lease's range alone, while the lease lives.
            input=protocol.InputRef(url=None if row["input_uri"] is None else
                                    await store.presign_input(row["input_uri"], start, end, row["lease_token"],
                                                              input_url_s(ctx)),
                                    range=[start, end], records=row["records"], data=_as_text(data)),
            output=protocol.OutputRef(url=await store.presign_put(row["output_key"], lifetime)),
            check=check,
        ),
    )


async def _inline_inputs(store: ObjectStore, cache: InputCache, rows: list[ClaimRow],
                         limit: int) -> list[bytes | None]:
    """Each lease's input range when the task's input is kept in the database (the claim read it), or
    when it is at most `limit` bytes (to ride in the answer: no GET for the executor), else None;
    None too when it cannot be read (the executor's GET meets the same trouble, and reports it as it
    always has). The ranges of one input object are read in one go when they lie close together (a
    batch's usually follow one another), and a small input object of this store's own is read whole
    once, for every claim after (`input_cache.py`)."""
    found: list[bytes | None] = [row["input_data"] for row in rows]  # kept inputs: read by the claim
    small: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        if row["input_uri"] is not None and row["byte_end"] - row["byte_start"] <= limit:
            small.setdefault(row["input_uri"], []).append(i)

    async def read(uri: str, members: list[int]) -> None:
        start = min(rows[i]["byte_start"] for i in members)
        end = max(rows[i]["byte_end"] for i in members)
        spans = [(rows[i]["byte_start"], rows[i]["byte_end"]) for i in members]
        if end - start > sum(e - s for s, e in spans) + limit:  # far apart: each on its own
            await asyncio.gather(*(read(uri, [i]) for i in members))
            return
        try:
            data = await cache.read_bytes(store, uri, start, end)
        except StoreError:
            return
        for i, (s, e) in zip(members, spans, strict=True):
            found[i] = data[s - start:e - start]

    await asyncio.gather(*(read(uri, members) for uri, members in small.items()))
    return found


def _as_text(data: bytes | None) -> str | None:
    """Inline input is JSONL text; bytes that are not UTF-8 are left to the executor's GET. (A kept
    input is always UTF-8: the API wrote it from validated records.)"""
    try:
        return None if data is None else data.decode("utf-8")
    except UnicodeDecodeError:
        return None
