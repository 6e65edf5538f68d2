"""Replicated spot checks: a replica's verified output compared with the results held for its subtask
(sql/schema/11_checks.sql keeps the state; the rule of agreement is minions/result_agreement.py's)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from minions.committed_results import ResultCorrupted, read_verified
from minions.config import Settings
from minions.logging import get_logger
from minions.result_agreement import outputs_agree
from minions.services.api.gateway import ApiGateway
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

log = get_logger(__name__)
# Outputs up to this size (both together) are compared on the event loop; larger ones in a thread.
COMPARE_ON_LOOP = 64 * 1024


async def held_bytes(store: ObjectStore, row: Any) -> bytes:
    """A held (or this call's) verified result: kept in the row, or its result object (checked)."""
    if row["result_data"] is not None:
        return bytes(row["result_data"])
    chunks = [chunk async for chunk in read_verified(store, store.uri_for(row["result_key"]), row["result_bytes"],
                                                     bytes(row["result_sha256"]))]
    return b"".join(chunks)


async def vote(gateway: ApiGateway, store: ObjectStore, settings: Settings, token: uuid.UUID, kind: str, records: int,
               seconds: float | None,
               copy: tuple[str | None, bytes | None, int | None, bytes | None, int | None]) -> str:
    """A replica's complete: its verified copy compared with its subtask's held results, then its vote
    (minion_check_vote): 'agreed', 'settled' (a vouched replica's own result committed), 'disputed',
    'no_quorum', or why it counts for nothing ('lost', ...).
    A vote that quarantined a voter is followed by the rest of the quarantine, in its own transaction."""
    key, sha256, size, kept, _dimension = copy
    held = await gateway.check_candidates(lease_token=token)
    mine_row = {"result_data": kept, "result_key": key, "result_bytes": size, "result_sha256": sha256}
    agrees_with = None
    if held:
        try:
            mine = await held_bytes(store, mine_row)
            for row in held:
                theirs = await held_bytes(store, row)
                limits = (settings.spot_check_min_cosine, settings.spot_check_min_similarity)
                same = (outputs_agree(kind, mine, theirs, *limits) if len(mine) + len(theirs) <= COMPARE_ON_LOOP
                        else await asyncio.to_thread(outputs_agree, kind, mine, theirs, *limits))
                if same:
                    agrees_with = row["round"]
                    break
        except (ObjectNotFound, ResultCorrupted, StoreError) as exc:
            # A held result that can no longer be read is no evidence either way: this replica's vote
            # disputes it, and a third executor settles it.
            log.warning("spot_check_unreadable", token=str(token), error=str(exc))
    verdict = await gateway.check_vote(lease_token=token, records=records, seconds=seconds, copy=copy,
                                       agrees_with=agrees_with)
    log.info("spot_check_vote", token=str(token), agrees_with=agrees_with, verdict=verdict)
    if verdict in ("agreed", "settled") and (rerun := await gateway.settle_quarantines()):
        log.warning("quarantines_settled", subtasks_rerun=rerun)
    return str(verdict)
