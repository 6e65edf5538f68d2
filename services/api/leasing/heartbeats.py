"""A heartbeat: the executor's leases kept alive (minion_heartbeat_as says which are still its own),
and fresh input URLs for those whose range rides by URL, since a claim's URL lasts only the lease
timeout plus the margin."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

from minions import protocol
from minions.logging import get_logger
from minions.services.api.context import Context
from minions.services.api.leasing.claims import input_url_s
from minions.services.api.leasing.leases import refuse_executor
from minions.store.base import StoreError

log = get_logger(__name__)


async def beat(ctx: Context, executor_id: uuid.UUID, token_id: int | None,
               named: Sequence[str]) -> protocol.HeartbeatReply:
    """Each lease token the executor named: 'ok' (renewed), 'lost' or 'cancelled'; `token_id` the
    caller's API token the SQL checks the executor against (None: an admin)."""
    parsed = {t: _as_uuid(t) for t in named}  # each token parsed once
    # Unparseable tokens were never leases; the executor still holds whatever it named.
    rows = await ctx.gateway.heartbeat(executor_id=executor_id, token_id=token_id,
                                       lease_tokens=[u for u in parsed.values() if u is not None])
    refuse_executor(rows[0]["verdict"], executor_id)
    states = {r["lease_token"]: r["state"] for r in rows[1:]}
    # A token that is not even a UUID was never a lease: it is lost, like any stale one.
    leases: dict[str, protocol.LeaseState] = {t: states.get(u, "lost") for t, u in parsed.items()}
    renewed = {t: u for t, u in parsed.items() if u is not None and leases[t] == "ok"}
    return protocol.HeartbeatReply(leases=leases, input_urls=await _input_urls(ctx, renewed))


async def _input_urls(ctx: Context, renewed: dict[str, uuid.UUID]) -> dict[str, str]:
    """A fresh input URL for each renewed lease whose range did not ride inline in its claim's
    answer (larger than MINIONS_INLINE_INPUT_BYTES, of an input object). What each lease reads is
    known from its claim here (lease_facts.py), else looked up (claimed through another API process,
    or before a restart)."""
    if not renewed:
        return {}
    facts: dict[str, Any] = {t: ctx.leases.get(u) for t, u in renewed.items()}
    if missing := [u for t, u in renewed.items() if facts[t] is None]:
        rows = {r["lease_token"]: r for r in await ctx.gateway.lease_inputs(lease_tokens=missing)}
        facts.update({t: rows.get(u) for t, u in renewed.items() if facts[t] is None})
    limit = ctx.settings.inline_input_bytes
    wanted = {t: f for t, f in facts.items()
              if f is not None and f["input_uri"] is not None and f["byte_end"] - f["byte_start"] > limit}
    if not wanted:
        return {}
    lifetime = input_url_s(ctx)

    async def sign(token: str, f: Any) -> str | None:
        try:
            return await ctx.store.presign_input(f["input_uri"], f["byte_start"], f["byte_end"], renewed[token],
                                                 lifetime)
        except (StoreError, ValueError) as exc:  # the claim's URL stays the executor's; not this beat's failure
            log.warning("input_url_not_renewed", error=str(exc))
            return None

    urls = await asyncio.gather(*(sign(t, f) for t, f in wanted.items()))
    return {t: url for t, url in zip(wanted, urls, strict=True) if url is not None}


def _as_uuid(token: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(token)
    except ValueError:
        return None
