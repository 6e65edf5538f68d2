"""The batched executor protocol: claims of many subtasks racing, batched completes with
mixed outcomes, inline inputs and outputs on the local store, fencing of stale tokens in a batch."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yarl

from minions import jsoncodec, protocol
from minions.agents.macos.protocol import parse_claims
from minions.testing.factories import make_task
from tests.support.api import ApiHarness, running_api
from tests.support.leases import sleep_output

LINE = 100  # make_task's nominal ranges are 100 bytes each: the input is written to match


def _input(store: Path, count: int) -> tuple[str, list[str]]:
    """An input object of `count` sleep records, each line exactly LINE bytes."""
    ids = [f"r{i:04d}" for i in range(count)]
    lines = []
    for record_id in ids:
        line = jsoncodec.dumps({"id": record_id, "ms": 1})
        lines.append(line + b" " * (LINE - 1 - len(line)) + b"\n")
    path = store / "inputs" / "batched.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))
    return path.as_uri(), ids


async def _task(database_url: str, store: Path, subtasks: int) -> tuple[int, list[str]]:
    uri, ids = _input(store, subtasks)
    conn = await asyncpg.connect(database_url)
    try:
        return await make_task(conn, subtasks=subtasks, input_uri=uri), ids
    finally:
        await conn.close()


async def _claim(api: ApiHarness, executor: str, most: int, token: str = "executor") -> list[dict[str, Any]]:
    reply = await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=0&max={most}", token=token)
    if reply.status == 204:
        return []
    assert reply.status == 200, reply.body
    leases: list[dict[str, Any]] = reply.body["leases"]
    return leases


def _output(lease: dict[str, Any], ids: list[str]) -> bytes:
    return sleep_output([ids[lease["subtask"]["subtask_id"]]])


async def test_fifty_racers_asking_for_ten_each_lease_every_subtask_exactly_once(
        database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store", inline_input_bytes=0) as api:
        task_id, _ = await _task(database_url, tmp_path / "store", 300)
        executors = [await api.register(f"racer-{i}") for i in range(50)]
        rounds = await asyncio.gather(*(_claim(api, e, 10) for e in executors))
        assert all(len(leases) <= 10 for leases in rounds)
        won = [lease for leases in rounds for lease in leases]
        # Whatever the race left (rows skipped while locked), one more claim each drains it.
        won += [lease for e in executors[:30] for lease in await _claim(api, e, 10)]
        subtasks = [lease["subtask"]["subtask_id"] for lease in won]
        assert sorted(subtasks) == list(range(300)), "every subtask leased exactly once"
        assert len({lease["lease"]["token"] for lease in won}) == 300
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch("SELECT subtask_id, lease_token::text AS token, attempts FROM subtasks "
                                    "WHERE task_id = $1", task_id)
            acquired = await conn.fetchval("SELECT count(*) FROM minion_subtask_acquirement WHERE task_id = $1",
                                           task_id)
        finally:
            await conn.close()
        assert {r["subtask_id"]: r["token"] for r in rows} == {
            lease["subtask"]["subtask_id"]: lease["lease"]["token"] for lease in won}
        assert all(r["attempts"] == 1 for r in rows) and acquired == 300


@pytest.mark.parametrize("in_database", [True, False], ids=["kept-in-row", "result-object"])
async def test_inline_input_and_output_round_trip_on_the_local_store(database_url: str, tmp_path: Path,
                                                                     in_database: bool) -> None:
    """A small inline output is committed in its subtask's row (sql/schema/07_results.sql), no result object written;
    with MINIONS_RESULT_IN_DATABASE_BYTES=0 it is copied to a result object. Either way the
    results read back are the verified bytes."""
    async with running_api(database_url, tmp_path / "store", **({} if in_database else
                                                                 {"result_in_database_bytes": 0})) as api:
        task_id, ids = await _task(database_url, tmp_path / "store", 3)
        executor = await api.register("inline")
        leases = await _claim(api, executor, 3)
        assert len(leases) == 3
        source = (tmp_path / "store" / "inputs" / "batched.jsonl").read_bytes()
        for lease in leases:
            start, end = lease["subtask"]["input"]["range"]
            assert lease["subtask"]["input"]["data"].encode() == source[start:end]
        outputs = {lease["lease"]["token"]: _output(lease, ids) for lease in leases}
        # A wrong inline output is refused like an uploaded one, and the lease stays live.
        first = leases[0]["lease"]["token"]
        wrong = await api.call("POST", f"/api/v1/leases/{first}/complete", token="executor",
                               json={"records": 1, "output": sleep_output(["nope"]).decode()})
        assert wrong.status == 422 and wrong.body["error"]["code"] == "output_mismatch"
        done = await api.call("POST", "/api/v1/leases/complete", token="executor", json={"leases": [
            {"token": token, "records": 1, "seconds": 0.01, "output": output.decode()}
            for token, output in outputs.items()]})
        assert done.status == 200, done.body
        assert [r["status"] for r in done.body["results"]] == [200, 200, 200]
        conn = await asyncpg.connect(database_url)
        try:
            rows = await conn.fetch("SELECT lease_token::text AS token, state, result_key, result_sha256, "
                                    "result_bytes, result_data FROM subtasks WHERE task_id = $1", task_id)
        finally:
            await conn.close()
        for row in rows:
            output = outputs[row["token"]]
            assert row["state"] == "done" and row["result_bytes"] == len(output)
            assert row["result_sha256"] == hashlib.sha256(output).digest()
            if in_database:
                assert row["result_key"] is None and row["result_data"] == output
            else:
                assert row["result_data"] is None
                assert (tmp_path / "store" / row["result_key"]).read_bytes() == output
        assert (tmp_path / "store" / "results").exists() is not in_database
        results = await api.call("GET", f"/api/v1/tasks/search/ranker/{await _name(database_url, task_id)}/results",
                                 token="admin")
        assert results.status == 200
        served = results.body if isinstance(results.body, bytes) else jsoncodec.dumps(results.body)
        assert all(f'"{i}"'.encode() in served for i in ids)


async def test_a_complete_checks_against_the_input_its_claim_read(database_url: str, tmp_path: Path) -> None:
    """The API keeps the inline input a claim sent (lease_facts.py) and checks the complete against
    those bytes: no second read. The input object rewritten in between (other ids) changes nothing;
    a re-read would refuse the output as a mismatch."""
    async with running_api(database_url, tmp_path / "store") as api:
        _, ids = await _task(database_url, tmp_path / "store", 2)
        executor = await api.register("kept")
        leases = await _claim(api, executor, 2)
        assert len(leases) == 2 and all(lease["subtask"]["input"]["data"] for lease in leases)
        path = tmp_path / "store" / "inputs" / "batched.jsonl"
        path.write_bytes(path.read_bytes().replace(b'"r0', b'"x0'))
        done = await api.call("POST", "/api/v1/leases/complete", token="executor", json={"leases": [
            {"token": lease["lease"]["token"], "records": 1, "seconds": 0.01,
             "output": _output(lease, ids).decode()} for lease in leases]})
        assert done.status == 200 and [r["status"] for r in done.body["results"]] == [200, 200], done.body


async def _name(database_url: str, task_id: int) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        name: str = await conn.fetchval("SELECT name FROM tasks WHERE id = $1", task_id)
        return name
    finally:
        await conn.close()


async def test_a_batched_complete_answers_each_lease_one_lost_among_good_ones(
        database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        task_id, ids = await _task(database_url, tmp_path / "store", 4)
        executor = await api.register("mixed")
        leases = await _claim(api, executor, 4)
        tokens = [lease["lease"]["token"] for lease in leases]
        # The third is lost before its complete: handed back (requeued).
        assert (await api.call("POST", f"/api/v1/leases/{tokens[2]}/release", token="executor")).status == 200
        # The fourth's output was PUT to its URL (the first protocol's path) rather than sent inline.
        fourth = leases[3]
        async with api.session.put(yarl.URL(fourth["subtask"]["output"]["url"], encoded=True),
                                   data=_output(fourth, ids)) as put:
            assert put.status in (200, 201, 204), await put.text()
        items = [{"token": t, "records": 1, "output": _output(lease, ids).decode()}
                 for t, lease in zip(tokens[:3], leases[:3], strict=True)]
        items.append({"token": tokens[3], "records": 1})
        items.append({"token": "not-a-token", "records": 1})
        reply = await api.call("POST", "/api/v1/leases/complete", token="executor", json={"leases": items})
        assert reply.status == 200, reply.body
        results = reply.body["results"]
        assert [r["token"] for r in results] == [*tokens, "not-a-token"]
        assert [r["status"] for r in results] == [200, 200, 409, 200, 409]
        assert results[2]["error"]["code"] == "lease_lost" and results[4]["error"]["code"] == "lease_lost"
        # A retried batch answers the committed ones 200 again and changes nothing.
        again = await api.call("POST", "/api/v1/leases/complete", token="executor", json={"leases": items[:2]})
        assert [r["status"] for r in again.body["results"]] == [200, 200]
        # Nothing left to commit at all: still one answer per lease.
        none = await api.call("POST", "/api/v1/leases/complete", token="executor", json={"leases": items[4:]})
        assert none.status == 200 and [r["status"] for r in none.body["results"]] == [409]
        conn = await asyncpg.connect(database_url)
        try:
            states = dict(await conn.fetch("SELECT subtask_id, state FROM subtasks WHERE task_id = $1", task_id))
        finally:
            await conn.close()
        lost = leases[2]["subtask"]["subtask_id"]
        assert states == {s: ("pending" if s == lost else "done") for s in range(4)}


async def test_a_stale_token_in_a_batch_is_fenced_and_changes_nothing(database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        task_id, ids = await _task(database_url, tmp_path / "store", 2)
        first, second = await api.register("first"), await api.register("second")
        [old] = await _claim(api, first, 1)
        stale = old["lease"]["token"]
        assert (await api.call("POST", f"/api/v1/leases/{stale}/release", token="executor")).status == 200
        mine = await _claim(api, second, 2)  # the released subtask again, under a new token, and the other
        assert len(mine) == 2 and stale not in {lease["lease"]["token"] for lease in mine}
        again = next(lease for lease in mine if lease["subtask"]["subtask_id"] == old["subtask"]["subtask_id"])
        assert again["subtask"]["attempt"] == 1  # a release does not count an attempt

        # The stale token's complete, fail and release: each 409, each beside a good lease.
        other = next(lease for lease in mine if lease is not again)
        output = _output(old, ids).decode()
        done = await api.call("POST", "/api/v1/leases/complete", token="executor", json={"leases": [
            {"token": stale, "records": 1, "output": output},
            {"token": other["lease"]["token"], "records": 1, "output": _output(other, ids).decode()}]})
        assert [r["status"] for r in done.body["results"]] == [409, 200]
        failed = await api.call("POST", "/api/v1/leases/fail", token="executor",
                                json={"leases": [{"token": stale, "error": "late", "retryable": False}]})
        released = await api.call("POST", "/api/v1/leases/release", token="executor", json={"leases": [stale]})
        assert failed.body["results"][0]["status"] == 409 and released.body["results"][0]["status"] == 409

        # A lease of another API token's executor: 403 for that lease alone.
        other_token = await api.call("POST", "/api/v1/tokens", token="admin", json={"role": "executor"})
        foreign = await api.call("POST", "/api/v1/leases/release", token=other_token.body["token"],
                                 json={"leases": [again["lease"]["token"]]})
        assert foreign.body["results"][0]["status"] == 403
        assert foreign.body["results"][0]["error"]["code"] == "not_your_lease"

        conn = await asyncpg.connect(database_url)
        try:
            row = await conn.fetchrow("SELECT state, lease_token::text AS token FROM subtasks "
                                      "WHERE task_id = $1 AND subtask_id = $2", task_id, again["subtask"]["subtask_id"])
        finally:
            await conn.close()
        assert dict(row) == {"state": "leased", "token": again["lease"]["token"]}, "the live lease is untouched"


async def test_a_failures_text_is_kept_to_the_protocols_cap(database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        task_id, _ = await _task(database_url, tmp_path / "store", 1)
        [lease] = await _claim(api, await api.register("talker"), 1)
        error = "Traceback: " + "z" * protocol.MAX_ERROR_CHARS
        failed = await api.call("POST", "/api/v1/leases/fail", token="executor", json={
            "leases": [{"token": lease["lease"]["token"], "error": error, "retryable": True}]})
        assert failed.body["results"][0]["status"] == 200, failed.body
        conn = await asyncpg.connect(database_url)
        try:
            kept = await conn.fetchval("SELECT last_error FROM subtasks WHERE task_id = $1", task_id)
        finally:
            await conn.close()
        assert kept == error[:protocol.MAX_ERROR_CHARS]


async def test_params_once_sends_each_tasks_params_once_per_answer(database_url: str, tmp_path: Path) -> None:
    """A task's params (up to 64 KiB) rode in every lease of a claim's answer. With `params=once` the
    first lease of each task carries them and the others refer to it (`params_from`); the agent's
    decoding gives every lease its params back. Without it (executors written before), every lease
    carries them; another value is 422."""
    async with running_api(database_url, tmp_path / "store") as api:
        task_id, _ = await _task(database_url, tmp_path / "store", 6)
        big = {"note": "x" * 30_000}
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("UPDATE tasks SET params = $2::jsonb WHERE id = $1", task_id, jsoncodec.dumps_str(big))
        finally:
            await conn.close()
        executor = await api.register("sharing")
        once = await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=0&max=3&params=once",
                              token="executor")
        assert once.status == 200, once.body
        leases = once.body["leases"]
        assert leases[0]["subtask"]["params"] == big and "params_from" not in leases[0]["subtask"]
        assert [(lease["subtask"]["params"], lease["subtask"]["params_from"]) for lease in leases[1:]] == [({}, 0)] * 2
        assert len(jsoncodec.dumps(once.body)) < 2 * 30_000
        decoded = parse_claims(once.body)
        assert [claim.subtask.params for claim in decoded] == [big] * 3
        each = await _claim(api, executor, 3)
        assert [lease["subtask"]["params"] for lease in each] == [big] * 3
        bad = await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=0&max=3&params=some",
                             token="executor")
        assert bad.status == 422 and "params" in bad.error["fields"]


def test_a_params_reference_to_another_task_or_a_later_lease_is_refused() -> None:
    def lease(task: str, params: dict[str, Any], params_from: int | None = None) -> dict[str, Any]:
        subtask = {"team": "t", "project": "p", "task_name": task, "subtask_id": 0, "attempt": 1, "kind": "sleep",
                   "model": None, "params": params,
                   "input": {"url": None, "range": [0, 2], "records": 1, "data": "{}"},
                   "output": {"url": "http://x/out"}}
        if params_from is not None:
            subtask["params_from"] = params_from
        return {"lease": {"token": "00000000-0000-0000-0000-000000000000",
                          "expires_at": "2026-01-01T00:00:00+00:00"}, "subtask": subtask}

    with pytest.raises(protocol.ProtocolError, match="params_from 1"):
        parse_claims({"leases": [lease("a", {}, 1), lease("a", {"x": 1})]})
    with pytest.raises(protocol.ProtocolError, match="params_from 0"):
        parse_claims({"leases": [lease("a", {"x": 1}), lease("b", {}, 0)]})
    assert [c.subtask.params for c in parse_claims({"leases": [lease("a", {"x": 1}), lease("a", {}, 0)]})] == [
        {"x": 1}, {"x": 1}]
