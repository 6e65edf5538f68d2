"""Replicated spot checks: a replica's verified output compared with the results held for its subtask
(sql/400_spot_checks.sql keeps the state; the comparison is here).

Two outputs of one subtask agree when they answer the same ids in the same order and, per kind:
embedding, every record's vectors have a cosine of at least MINIONS_SPOT_CHECK_MIN_COSINE (bf16 and
fp16 against fp32 stay above 0.9999 for the models served); completion, every record's `text` has a
similarity of at least MINIONS_SPOT_CHECK_MIN_SIMILARITY (difflib's ratio: only greedy completions
are checked, sql/400's minion_checkable, and greedy decoding on other hardware or kernels may still
part after a few tokens, where a lie differs from the first); sleep, the same ids. Both outputs
passed the shape check at their own complete (output_check.py), so each line is an object with `id`
and its kind's field.
"""

from __future__ import annotations

import asyncio
import difflib
import math
import uuid
from collections.abc import Sequence
from typing import Any

import orjson

from minions.config import Settings
from minions.db.queries import Queries
from minions.logging import get_logger
from minions.services.api.verified_output import ResultCorrupted, read_verified
from minions.store.base import ObjectNotFound, ObjectStore, StoreError

Q = Queries("api")
log = get_logger(__name__)
# Outputs up to this size (both together) are compared on the event loop; larger ones in a thread.
COMPARE_ON_LOOP = 64 * 1024


def spot_check_session(settings: Settings) -> dict[str, str]:
    """The session settings the claim and the votes read (sql/400's minion_trust_setting)."""
    return {"minions.spot_check_share": repr(float(settings.spot_check_share)),
            "minions.trust_agreements": str(int(settings.trust_agreements)),
            "minions.quarantine_after": str(int(settings.quarantine_after)),
            # 'team=share,...' without blanks ('' : none)
            "minions.spot_check_team_shares": ",".join(
                "=".join(part.strip() for part in item.split("=", 1))
                for item in settings.spot_check_team_shares.split(",") if item.strip())}


def _lines(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        return -2.0
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(math.fsum(x * x for x in a))
    nb = math.sqrt(math.fsum(y * y for y in b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return dot / (na * nb)


def _similar(a: object, b: object, min_similarity: float) -> bool:
    if a == b:
        return True
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= min_similarity


def agree(kind: str, mine: bytes, theirs: bytes, min_cosine: float, min_similarity: float = 1.0) -> bool:
    """Whether two verified outputs of one subtask say the same (see the module's docstring)."""
    try:
        a, b = _lines(mine), _lines(theirs)
    except orjson.JSONDecodeError:
        return False
    if len(a) != len(b) or any(x.get("id") != y.get("id") for x, y in zip(a, b, strict=True)):
        return False
    if kind == "embedding":
        return all(_cosine(x.get("embedding") or [], y.get("embedding") or []) >= min_cosine
                   for x, y in zip(a, b, strict=True))
    if kind == "completion":
        return all(_similar(x.get("text"), y.get("text"), min_similarity) for x, y in zip(a, b, strict=True))
    return True  # sleep: the same ids


async def _bytes_of(store: ObjectStore, row: Any) -> bytes:
    """A held (or this call's) verified result: kept in the row, or its result object (checked)."""
    if row["result_data"] is not None:
        return bytes(row["result_data"])
    chunks = [chunk async for chunk in read_verified(store, store.uri_for(row["result_key"]), row["result_bytes"],
                                                     bytes(row["result_sha256"]))]
    return b"".join(chunks)


async def vote(pool: Any, store: ObjectStore, settings: Settings, token: uuid.UUID, kind: str, records: int,
               seconds: float | None,
               copy: tuple[str | None, bytes | None, int | None, bytes | None, int | None]) -> str:
    """A replica's complete: its verified copy compared with its subtask's held results, then its vote
    (minion_check_vote): 'agreed', 'disputed', 'no_quorum', or why it counts for nothing ('lost', ...).
    A vote that quarantined a voter is followed by the rest of the quarantine, in its own transaction."""
    key, sha256, size, kept, dimension = copy
    held = await pool.fetch(Q.check_candidates, token)
    mine_row = {"result_data": kept, "result_key": key, "result_bytes": size, "result_sha256": sha256}
    agrees_with = None
    if held:
        try:
            mine = await _bytes_of(store, mine_row)
            for row in held:
                theirs = await _bytes_of(store, row)
                limits = (settings.spot_check_min_cosine, settings.spot_check_min_similarity)
                same = (agree(kind, mine, theirs, *limits) if len(mine) + len(theirs) <= COMPARE_ON_LOOP
                        else await asyncio.to_thread(agree, kind, mine, theirs, *limits))
                if same:
                    agrees_with = row["round"]
                    break
        except (ObjectNotFound, ResultCorrupted, StoreError) as exc:
            # A held result that can no longer be read is no evidence either way: this replica's vote
            # disputes it, and a third executor settles it.
            log.warning("spot_check_unreadable", token=str(token), error=str(exc))
    verdict = await pool.fetchval(Q.check_vote, token, records, seconds, key, sha256, size, kept, dimension,
                                  agrees_with)
    log.info("spot_check_vote", token=str(token), agrees_with=agrees_with, verdict=verdict)
    if verdict == "agreed" and (rerun := await pool.fetchval(Q.settle_quarantines)):
        log.warning("quarantines_settled", subtasks_rerun=rerun)
    return str(verdict)
