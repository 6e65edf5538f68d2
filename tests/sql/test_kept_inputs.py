"""Small inputs kept in the database (sql/schema/08_inputs.sql): the inline records of a task
split at submission are committed with it, no input object; every claim sends its range from there,
complete checks and the error lines of results read it, and the schema holds an input in one place."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yarl

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.waiting import eventually
from tests.support.api import ApiHarness, running_api
from tests.support.leases import sleep_output

RECORDS = [{"id": f"r{i}", "ms": 1} for i in range(7)]


def _task(name: str, records: list[dict[str, Any]] = RECORDS) -> dict[str, Any]:
    return {"team": "search", "project": "ranker", "name": name, "kind": "sleep", "subtask_size": 3,
            "input": {"records": records}}


async def _claim(api: ApiHarness, executor: str, query: str) -> Any:
    reply = await api.call("POST", f"/api/v1/executors/{executor}/claim?wait=0{query}", token="executor")
    assert reply.status == 200, reply.body
    return reply.body


def _ids(lease: dict[str, Any]) -> list[str]:
    return [jsoncodec.loads(line)["id"] for line in lease["subtask"]["input"]["data"].splitlines()]


async def test_small_inline_records_are_kept_with_the_task_and_every_step_reads_them(
        database_url: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with running_api(database_url, store) as api:
        submitted = await api.call("POST", "/api/v1/tasks", json=_task("kept"))
        assert submitted.status == 201 and submitted.body["input_uri"] is None
        assert submitted.body["status"] == "queued" and submitted.body["subtasks"]["total"] == 3
        assert not (store / "inputs").exists()  # no input object, and nothing recorded for one
        conn = await connect(database_url)
        kept = await conn.fetchval("SELECT i.data FROM task_inputs i JOIN tasks t ON t.id = i.task_id "
                                   "WHERE t.name = 'kept'")
        assert await conn.fetchval("SELECT count(*) FROM input_objects") == 0
        assert [jsoncodec.loads(line)["id"] for line in kept.splitlines()] == [r["id"] for r in RECORDS]

        executor = await api.register("kept")
        first = await _claim(api, executor, "")  # the first protocol's single lease
        batch = (await _claim(api, executor, "&max=5"))["leases"]
        leases = [first, *batch]
        assert len(leases) == 3
        for lease in leases:
            ref = lease["subtask"]["input"]
            assert ref["url"] is None  # no object to GET: the range rides inline, whatever its size
            assert ref["data"].encode() == kept[ref["range"][0]:ref["range"][1]]

        # Completed inline (checked against the kept bytes the claim read), and through the output
        # URL (the check streams the kept bytes); the third fails for good.
        done = await api.call("POST", f"/api/v1/leases/{first['lease']['token']}/complete", token="executor",
                              json={"records": 3, "output": sleep_output(_ids(first)).decode()})
        assert done.status == 200, done.body
        wrong = await api.call("POST", f"/api/v1/leases/{batch[0]['lease']['token']}/complete", token="executor",
                               json={"records": 3, "output": sleep_output(["x", "y", "z"]).decode()})
        assert wrong.status == 422 and wrong.error["code"] == "output_mismatch"
        async with api.session.put(yarl.URL(batch[0]["subtask"]["output"]["url"], encoded=True),
                                   data=sleep_output(_ids(batch[0]))) as put:
            assert put.status in (200, 201, 204), await put.text()
        done = await api.call("POST", f"/api/v1/leases/{batch[0]['lease']['token']}/complete", token="executor",
                              json={"records": 3})
        assert done.status == 200, done.body
        failed = await api.call("POST", f"/api/v1/leases/{batch[1]['lease']['token']}/fail", token="executor",
                                json={"error": "device lost", "retryable": False})
        assert failed.status == 200, failed.body

        results = await api.call("GET", "/api/v1/tasks/search/ranker/kept/results")
        assert results.status == 200
        lines = [jsoncodec.loads(line) for line in results.body.splitlines()]
        assert [line["id"] for line in lines] == [r["id"] for r in RECORDS]
        # The failed subtask's records get their error lines, their ids read from the kept input.
        assert [line["id"] for line in lines if "error" in line] == _ids(batch[1])
        await conn.close()


async def test_a_lease_claimed_elsewhere_is_checked_against_the_kept_input(
        database_url: str, tmp_path: Path) -> None:
    """An API process that did not hand the lease out (another worker, a restart) has no claim facts:
    its lookup reads the kept range."""
    async with running_api(database_url, tmp_path / "store") as api:
        assert (await api.call("POST", "/api/v1/tasks", json=_task("elsewhere"))).status == 201
        executor = await api.register("first")
        leases = (await _claim(api, executor, "&max=3"))["leases"]
    async with running_api(database_url, tmp_path / "store") as other:
        for lease, output in zip(leases, ([], *(_ids(lease) for lease in leases[1:])), strict=True):
            # The leases answer to the executor token of the API that handed them out.
            reply = await other.call("POST", f"/api/v1/leases/{lease['lease']['token']}/complete", token=api.executor,
                                     json={"records": lease["subtask"]["input"]["records"],
                                           "output": sleep_output(list(output)).decode()})
            if not output:  # an empty output for three records: refused against the kept bytes
                assert reply.status == 422 and reply.error["code"] == "output_mismatch"
            else:
                assert reply.status == 200, reply.body


async def test_with_the_setting_at_zero_small_records_are_an_input_object(database_url: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    async with running_api(database_url, store, input_in_database_bytes=0) as api:
        submitted = await api.call("POST", "/api/v1/tasks", json=_task("object"))
        assert submitted.status == 201 and submitted.body["input_uri"].startswith(store.as_uri())
        executor = await api.register("object")
        [lease] = (await _claim(api, executor, "&max=1"))["leases"]
        assert lease["subtask"]["input"]["url"] and lease["subtask"]["input"]["data"]
    conn = await connect(database_url)
    assert await conn.fetchval("SELECT count(*) FROM task_inputs") == 0
    await conn.close()


async def test_a_kept_task_submitted_again_is_the_same_task_and_another_body_a_conflict(
        database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        first = await api.call("POST", "/api/v1/tasks", json=_task("again"))
        again = await api.call("POST", "/api/v1/tasks", json=_task("again"))
        assert (first.status, again.status) == (201, 200) and again.body["created_at"] == first.body["created_at"]
        other = await api.call("POST", "/api/v1/tasks", json=_task("again", RECORDS[:2]))
        assert other.status == 409 and other.error["code"] == "task_exists"
    conn = await connect(database_url)
    assert await conn.fetchval("SELECT count(*) FROM task_inputs") == 1
    await conn.close()


# --- the schema ---------------------------------------------------------------------------------

SUBMIT = ("SELECT id FROM minion_submit_task('search', 'p', $1, 'sleep', 'sleep', '{}', 0, 1, NULL, $2, 'h', "
          "NULL, $3, $4, $5, $6, $7)")
DATA = b'{"id":"a","ms":1}\n{"id":"b","ms":1}\n'


async def test_the_schema_keeps_an_input_in_exactly_one_place(database_url: str) -> None:
    conn = await connect(database_url)
    task_id = await conn.fetchval(SUBMIT, "ok", None, [0, 18], [18, 36], [0, 1], [1, 1], DATA)
    assert await conn.fetchval("SELECT minion_kept_input($1, 18, 36)", task_id) == DATA[18:]
    assert await conn.fetchval("SELECT input_uri FROM tasks WHERE id = $1", task_id) is None
    assert await conn.fetchval("SELECT minion_team_input_bytes('search')") == len(DATA)  # the team's quota
    with pytest.raises(asyncpg.CheckViolationError, match="cannot change"):
        await conn.execute("UPDATE task_inputs SET data = 'x' WHERE task_id = $1", task_id)
    # Neither an object nor kept bytes: refused at commit.
    with pytest.raises(asyncpg.CheckViolationError, match="either as an object"):
        await conn.fetchval(SUBMIT, "neither", None, None, None, None, None, None)
    # Both at once, none of the subtasks, or subtasks that stop short of the bytes: refused.
    for name, uri, ends in (("both", "file:///x.jsonl", [18, 36]), ("unsplit", None, None),
                            ("short", None, [18, 30])):
        starts = None if ends is None else [0, 18]
        with pytest.raises(asyncpg.InvalidParameterValueError, match="kept input"):
            await conn.fetchval(SUBMIT, name, uri, starts, ends, starts and [0, 1], starts and [1, 1], DATA)
    assert await conn.fetchval("SELECT count(*) FROM tasks") == 1
    # A task created and deleted again in one transaction commits: its input went with it.
    async with conn.transaction():
        gone = await conn.fetchval(SUBMIT, "gone", None, [0, 18], [18, 36], [0, 1], [1, 1], DATA)
        await conn.execute("DELETE FROM tasks WHERE id = $1", gone)
    # The bytes go with their task, and the team's quota gets the room back.
    await conn.execute("DELETE FROM tasks WHERE id = $1", task_id)
    assert await conn.fetchval("SELECT count(*) FROM task_inputs") == 0
    assert await conn.fetchval("SELECT minion_team_input_bytes('search')") == 0
    await conn.close()


async def test_kept_inputs_count_against_the_team_quota_with_its_objects(database_url: str) -> None:
    """team_input_usage holds what the quota is measured against: objects and kept inputs, counted as
    they come and go, never summed again."""
    conn = await connect(database_url)
    record = "SELECT minion_record_input($1, 'search', $2, NULL, $3)"
    assert await conn.fetchval(record, "file:///a.jsonl", 40, 100) == "ok"
    # 40 stored + 36 kept fits a quota of 100; another 36 does not, and leaves nothing behind.
    assert await conn.fetchval(SUBMIT.replace("$7)", "$7, 100)"), "first", None, [0, 18], [18, 36], [0, 1], [1, 1],
                               DATA) is not None
    with pytest.raises(asyncpg.ConfigurationLimitExceededError, match="quota_exceeded"):
        await conn.fetchval(SUBMIT.replace("$7)", "$7, 100)"), "second", None, [0, 18], [18, 36], [0, 1], [1, 1],
                            DATA)
    assert await conn.fetchval("SELECT count(*) FROM tasks WHERE name = 'second'") == 0
    assert await conn.fetchval(record, "file:///b.jsonl", 30, 100) == "quota_exceeded"
    assert await conn.fetchval("SELECT minion_team_input_bytes('search')") == 76
    # The object's garbage collection gives its room back.
    await conn.execute("DELETE FROM input_objects WHERE uri = 'file:///a.jsonl'")
    assert await conn.fetchval("SELECT minion_team_input_bytes('search')") == 36
    assert await conn.fetchval(record, "file:///b.jsonl", 30, 100) == "ok"
    await conn.close()


async def test_a_claim_that_began_before_the_task_was_committed_still_reads_its_kept_input(
        database_url: str) -> None:
    """The claim's statement takes its snapshot when it starts; minion_claim_batch takes fresh ones and
    can lease a task committed meanwhile. The kept range is read with a snapshot of its own (a
    VOLATILE minion_kept_input): never a lease with neither a URL nor the bytes."""
    from minions.db.queries import Queries
    from minions.testing.factories import make_executor, make_token

    setup, blocker, claimer = await connect(database_url), await connect(database_url), await connect(database_url)
    _, token_id = await make_token(setup, "executor")
    executor = await make_executor(setup, token_id)
    blocking = blocker.transaction()
    await blocking.start()
    await blocker.execute("LOCK TABLE executor_preferences IN ACCESS EXCLUSIVE MODE")
    claim = asyncio.create_task(claimer.fetch(Queries("api").claim_batch, executor, token_id, 5, 0.0))
    await asyncio.sleep(0.3)  # the claim's statement has begun, and waits on the preferences
    assert not claim.done()
    await setup.fetchval(SUBMIT, "late", None, [0, 18], [18, 36], [0, 1], [1, 1], DATA)
    await blocking.commit()
    rows = await asyncio.wait_for(claim, 10)
    assert [r["verdict"] for r in rows] == ["leased", "leased"]
    assert [r["input_data"] for r in rows] == [DATA[:18], DATA[18:]]
    for conn in (setup, blocker, claimer):
        await conn.close()


async def test_deletes_of_several_teams_take_their_counts_in_one_order(database_url: str) -> None:
    """A statement deleting inputs of several teams (the garbage collector's sweep) takes their count
    rows in team order, whatever order its rows come in: a delete that takes them in that order too
    never deadlocks with it (with a count per row, the sweep held beta's while it waited for alpha's)."""
    setup, holder, sweeper = await connect(database_url), await connect(database_url), await connect(database_url)
    record = "SELECT minion_record_input($1, $2, 10, NULL, 1000)"
    # In uri order and in the table's order, beta's object comes before alpha's.
    for uri, team in [("file:///1", "beta"), ("file:///2", "alpha"), ("file:///3", "alpha"), ("file:///4", "beta")]:
        assert await setup.fetchval(record, uri, team) == "ok"
    holding = holder.transaction()
    await holding.start()
    await holder.execute("DELETE FROM input_objects WHERE uri = 'file:///3'")  # holds alpha's count
    sweep = asyncio.create_task(sweeper.execute("DELETE FROM input_objects WHERE uri IN ('file:///1', 'file:///2')"))

    async def sweep_waits() -> bool:
        state = await setup.fetchval("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                                     sweeper.get_server_pid())
        return state == "Lock"

    await eventually(sweep_waits, "the sweep to wait for alpha's count")
    await holder.execute("DELETE FROM input_objects WHERE uri = 'file:///4'")  # beta's count: not held
    await holding.commit()
    assert await asyncio.wait_for(sweep, 10) == "DELETE 2"
    counts = await setup.fetch("SELECT team, bytes FROM team_input_usage ORDER BY team")
    assert [(r["team"], r["bytes"]) for r in counts] == [("alpha", 0), ("beta", 0)]
    for conn in (setup, holder, sweeper):
        await conn.close()
