"""A batch's end: once its task has ended (or its window passed and its task was cancelled), its
results become OpenAI's output file (successes) and error file (everything else), and the batch
ends completed, cancelled or expired. Run by whichever API process reads the batch first; a SQL
function lets one finalizer at a time take it (and retake it from one that died)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.logging import get_logger
from minions.services.api.appkeys import GATEWAY, STORE
from minions.services.api.openai.gateway import openai_gateway
from minions.services.api.openai.lines import batched, lines_of
from minions.services.api.openai.translate import new_id, parse_result, response_body
from minions.services.api.results.reading import result_chunks

log = get_logger(__name__)
STALE_FINALIZER_S = 600.0
WAIT_FOR_FINALIZER_S = 2.0  # a read waits this long for a finalization it started, then answers
_running: set[asyncio.Task[None]] = set()

_REASONS = {"cancel": ("batch_cancelled", "This request was not executed: the batch was cancelled."),
            "expire": ("batch_expired", "This request could not be executed before the completion window "
                                        "expired.")}


@dataclass
class Tally:
    completed: int = 0
    failed: int = 0


async def settle(request: web.Request, row: Any) -> bool:
    """Expire a batch past its window and finalize an ended one. True when something changed (the
    caller reads the row again)."""
    if row["task_id"] is None or _ended(row):
        return False
    gateway = openai_gateway(request.app)
    changed = False
    if row["task_finished_at"] is None and row["ending"] is None and row["expires_at"] < datetime.now(UTC):
        changed = await gateway.end_batch(batch_id=row["id"], ending="expire")
    if await gateway.begin_finalize(batch_id=row["id"], stale_s=STALE_FINALIZER_S):
        job = asyncio.create_task(_finalize(request, row["id"]))
        _running.add(job)
        job.add_done_callback(_running.discard)
        # Shielded: the client hanging up must not stop the files being written.
        await asyncio.wait({asyncio.shield(job)}, timeout=WAIT_FOR_FINALIZER_S)
        changed = True
    return changed


def _ended(row: Any) -> bool:
    return any(row[c] is not None for c in ("completed_at", "failed_at", "expired_at", "cancelled_at"))


async def _finalize(request: web.Request, batch_id: str) -> None:
    gateway = openai_gateway(request.app)
    try:
        batch = await gateway.batch_by_id(batch_id=batch_id)
        assert batch is not None  # begin_finalize just took it, and no batch row is ever deleted
        task = await gateway.task_row(task_id=batch["task_id"])
        reason = _REASONS.get(batch["ending"] or "", ("server_error", "failed"))
        tally = Tally()
        output_id = await _write_file(request, batch, task, reason, "output", tally)
        error_id = await _write_file(request, batch, task, reason, "error", Tally())
        await gateway.finish_batch(batch_id=batch_id, output_file_id=output_id, error_file_id=error_id,
                                   completed=tally.completed, failed=tally.failed)
        log.info("openai_batch_finalized", batch_id=batch_id, completed=tally.completed, failed=tally.failed)
    except Exception:
        # Left to a later read: begin_finalize retakes it once stale.
        log.exception("openai_batch_finalize_failed", batch_id=batch_id)


async def _write_file(request: web.Request, batch: Any, task: Any, reason: tuple[str, str], which: str,
                      tally: Tally) -> str | None:
    file_id = new_id("file-")
    store = request.app[STORE]
    lines = _output_lines(request, batch, task, reason, which, tally)
    uri, size = await store.put_stream(f"openai/files/{file_id}.jsonl", batched(lines))
    if size == 0:
        await store.delete(uri)
        return None
    filename = f"{batch['id']}_{which}.jsonl"
    await openai_gateway(request.app).add_file(file_id=file_id, team=batch["team"], purpose="batch_output",
                                               filename=filename, size=size, uri=uri,
                                               created_by=batch["created_by"])
    return file_id


async def _output_lines(request: web.Request, batch: Any, task: Any, reason: tuple[str, str], which: str,
                        tally: Tally) -> AsyncIterator[bytes]:
    """The lines of the output (`which` = "output") or error file, in input order: the task's input
    records zipped with its results (one result line per record, failures included)."""
    store = request.app[STORE]
    results = lines_of(result_chunks(request.app[GATEWAY], store, task))
    records = lines_of(store.read(task["input_uri"]))
    created = int(task["finished_at"].timestamp())
    async for line in records:
        if not line.strip():
            continue
        record = jsoncodec.loads(line)
        meta = record["openai"]
        got = [record] + [jsoncodec.loads(await anext(records)) for _ in range(meta["records"] - 1)]
        # parse_result: a line that is not JSON (committed before complete checked shapes) is this
        # request's error, not the finalizer's crash.
        outcomes = [parse_result(r) for r in [await anext(results, b"") for _ in got] if r.strip()]
        request_id = new_id("req_")
        entry: dict[str, Any] = {"id": new_id("batch_req_"), "custom_id": meta["custom_id"]}
        if len(outcomes) < len(got):  # never split, or no results: cancelled before it ran
            outcome_error: tuple[str, str] | None = reason
            body = None
        else:
            result = response_body(batch["endpoint"], meta["body"], outcomes, created)
            body, outcome_error = result.body, result.error
            failures = [str(o["error"]) for o in outcomes if isinstance(o, dict) and "error" in o]
            if outcome_error is not None and failures and batch["ending"]:
                message = failures[0]
                if message == "task cancelled":
                    outcome_error = reason
        if body is not None:
            tally.completed += 1
            if which == "output":
                entry["response"] = {"status_code": 200, "request_id": request_id, "body": body}
                entry["error"] = None
                yield jsoncodec.dumps_line(entry)
        else:
            tally.failed += 1
            if which == "error":
                assert outcome_error is not None
                code, message = outcome_error
                entry["response"] = None
                entry["error"] = {"code": code, "message": message}
                yield jsoncodec.dumps_line(entry)
