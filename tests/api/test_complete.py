"""copy_verified and read_verified on a real local store: what complete writes, what results read."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from minions import jsoncodec
from minions.committed_results import (
    VERIFY_IN_MEMORY,
    ResultCompacted,
    ResultCorrupted,
    committed_uri,
    read_committed,
    read_verified,
)
from minions.services.api.leasing.complete import copy_verified
from minions.services.api.leasing.output_check import OutputMismatch
from minions.store.base import ObjectNotFound, StoreError
from minions.store.local import LocalStore

IDS = [f"r{i}" for i in range(5)]


async def _lease(store: LocalStore, token: uuid.UUID) -> dict[str, Any]:
    data = b"".join(jsoncodec.dumps_line({"id": i, "ms": 1}) for i in IDS)
    uri = await store.put_bytes("inputs/in.jsonl", b"junk before\n" + data)
    return {"task_id": 4, "subtask_id": 2, "attempt": 1, "records": len(IDS), "kind": "sleep", "input_uri": uri,
            "byte_start": len(b"junk before\n"), "byte_end": len(b"junk before\n") + len(data),
            "output_key": f"outputs/4/2/1-{token}.jsonl"}


def _files(store: LocalStore, prefix: str) -> list[Path]:
    return sorted(p for p in (store.root / prefix).rglob("*") if p.is_file()) if (store.root / prefix).exists() else []


async def test_complete_copies_exactly_the_bytes_it_checked(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    token = uuid.uuid4()
    lease = await _lease(store, token)
    with pytest.raises(ObjectNotFound):
        await copy_verified(store, lease, token)  # nothing written yet
    output = b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": 1}) for i in IDS)
    await store.put_bytes(lease["output_key"], output[:-1])  # no final newline
    with pytest.raises(OutputMismatch):
        await copy_verified(store, lease, token)
    assert _files(store, "results") == []  # a refused output leaves no copy
    await store.put_bytes(lease["output_key"], output)
    verified = await copy_verified(store, lease, token)
    assert verified.key.startswith(f"results/4/2/1-{token}-")
    assert (verified.sha256, verified.size) == (hashlib.sha256(output).digest(), len(output))
    assert (store.root / verified.key).read_bytes() == output


@pytest.mark.parametrize("size", [1000, VERIFY_IN_MEMORY + 1000])
async def test_a_changed_result_is_refused_before_any_byte_is_served(tmp_path: Path, size: int) -> None:
    store = LocalStore(tmp_path)
    original = b"x" * size
    uri = await store.put_bytes("results/1/0/r.jsonl", original)
    digest = hashlib.sha256(original).digest()
    assert b"".join([c async for c in read_verified(store, uri, size, digest)]) == original
    await store.put_bytes("results/1/0/r.jsonl", b"y" + original[1:])
    served = []
    with pytest.raises(ResultCorrupted):
        async for chunk in read_verified(store, uri, size, digest):
            served.append(chunk)
    assert served == []


BAD_OUTPUTS = [
    (b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": 1}) for i in IDS)[:-1], "does not end with a newline"),
    (b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": 1}) for i in reversed(IDS)), 'output line 1 has id "r4"'),
    (b"".join(jsoncodec.dumps_line({"id": i}) for i in IDS[:4]), "the output has 4 lines"),
    (b"".join(jsoncodec.dumps_line({"id": i}) for i in [*IDS, "r5"]), "more lines than"),
    (b"not json\n", "output line 1 is not JSON"),
]


@pytest.mark.parametrize("given_input", [False, True], ids=["input-read", "input-given"])
@pytest.mark.parametrize(("output", "why"), BAD_OUTPUTS)
async def test_an_inline_output_checked_whole_is_refused_as_a_streamed_one_is(
        tmp_path: Path, output: bytes, why: str, given_input: bool) -> None:
    store = LocalStore(tmp_path)
    token = uuid.uuid4()
    lease = await _lease(store, token)
    await store.put_bytes(lease["output_key"], output)
    with pytest.raises(OutputMismatch) as streamed:
        await copy_verified(store, lease, token)  # read from the output key: the streaming check
    given = b"".join(jsoncodec.dumps_line({"id": i, "ms": 1}) for i in IDS) if given_input else None
    with pytest.raises(OutputMismatch) as whole:
        await copy_verified(store, lease, token, output, given)
    assert str(whole.value) == str(streamed.value) and why in str(whole.value)
    assert _files(store, "results") == []


async def test_an_inline_output_is_checked_against_the_input_the_claim_read(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    token = uuid.uuid4()
    lease = await _lease(store, token)
    output = b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": 1}) for i in IDS)
    verified = await copy_verified(store, lease, token, output)  # the input range read here
    assert (verified.sha256, verified.size) == (hashlib.sha256(output).digest(), len(output))
    assert (store.root / verified.key).read_bytes() == output
    # Given the claim's bytes, those are what it answers to (other ids: refused).
    other = b"".join(jsoncodec.dumps_line({"id": f"x{i}", "ms": 1}) for i in range(5))
    with pytest.raises(OutputMismatch, match='record 1 of the subtask has id "x0"'):
        await copy_verified(store, lease, token, output, other)
    await store.delete(lease["input_uri"])
    with pytest.raises(StoreError, match="is gone"):
        await copy_verified(store, lease, token, output)


@pytest.mark.parametrize("big_input", [False, True], ids=["checked-whole", "checked-streamed"])
async def test_a_small_inline_output_is_kept_for_the_row_not_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, big_input: bool) -> None:
    """Up to `keep_up_to` bytes an inline output is returned `kept` (sql/schema/07_results.sql), after the same check,
    whether the check ran whole or (an input range too big to read whole) streamed; above it, copied."""
    if big_input:
        monkeypatch.setattr("minions.services.api.leasing.complete.CHECK_WHOLE", 8)
    store = LocalStore(tmp_path)
    token = uuid.uuid4()
    lease = await _lease(store, token)
    output = b"".join(jsoncodec.dumps_line({"id": i, "slept_ms": 1}) for i in IDS)
    kept = await copy_verified(store, lease, token, output, keep_up_to=len(output))
    assert (kept.key, kept.kept, kept.sha256, kept.size) == (None, output, hashlib.sha256(output).digest(),
                                                             len(output))
    assert _files(store, "results") == []
    wrong = output.replace(b'"r3"', b'"r9"')
    with pytest.raises(OutputMismatch, match="r9"):
        await copy_verified(store, lease, token, wrong, keep_up_to=len(output))
    copied = await copy_verified(store, lease, token, output, keep_up_to=len(output) - 1)
    assert copied.kept is None and copied.key is not None and (store.root / copied.key).read_bytes() == output


async def test_a_row_reads_its_kept_bytes_and_says_compacted_once_gc_dropped_them(tmp_path: Path) -> None:
    """read_committed takes a row's kept bytes (sql/schema/07_results.sql) without the store; once gc dropped them after
    the task's compaction (SHA-256 kept, no key, no bytes) it raises ResultCompacted, which a results
    stream logs as such, not as a committed object gone missing."""
    store = LocalStore(tmp_path)
    output = b'{"id":"r0","slept_ms":1}\n'
    row = {"subtask_id": 3, "output_key": "outputs/4/3/1-x.jsonl", "result_key": None,
           "result_sha256": hashlib.sha256(output).digest(), "result_bytes": len(output), "result_data": output}
    assert [chunk async for chunk in read_committed(store, row)] == [output]
    assert committed_uri(store, row) == "(subtask 3's row)"
    dropped = {**row, "result_data": None}
    with pytest.raises(ResultCompacted, match="compacted into its task's parts"):
        [chunk async for chunk in read_committed(store, dropped)]
    assert committed_uri(store, dropped) == "(subtask 3's row)"
    # A result from before verified copies (no SHA-256) is still read from its attempt's output.
    await store.put_bytes(row["output_key"], output)
    old = {**dropped, "result_sha256": None, "result_bytes": None}
    assert b"".join([chunk async for chunk in read_committed(store, old)]) == output
    assert committed_uri(store, old) == store.uri_for(row["output_key"])
