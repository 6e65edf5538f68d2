"""Complete verifies the output. An output that does not hold exactly one line per
input record, with the input's ids in order, is refused with 422 `output_mismatch`, commits
nothing, and leaves the lease live: the executor can fix the output and complete again, or fail it.

Real services (API and splitter as processes) on a real PostgreSQL and a local store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from minions import jsoncodec
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from tests.support.leases import LeaseSteps, sleep_output

IDS = ["a", "b", "c"]


@pytest.fixture
async def steps(database_url: str, tmp_path: Path) -> AsyncIterator[LeaseSteps]:
    # A long lease timeout: the probes pause between steps without heartbeating.
    services = Services(database_url, tmp_path / "services", lease_timeout_s=120)
    try:
        await services.start_all()
        admin, executor = await make_tokens(database_url)
        async with aiohttp.ClientSession() as session:
            yield LeaseSteps(services.api_url, admin, executor, session)
    finally:
        services.stop_all()


WRONG_OUTPUTS = {
    "empty": b"",
    "a line short": sleep_output(IDS[:2]),
    "a line too many": sleep_output([*IDS, "d"]),
    "ids out of order": sleep_output(["a", "c", "b"]),
    "an injected id": sleep_output(["a", "b", "zzz"]),
    "an id of another type": sleep_output(["a", "b"]) + jsoncodec.dumps_line({"id": 3, "slept_ms": 1}),
    "a line that is not JSON": sleep_output(IDS[:2]) + b"not json\n",
    "a line without an id": sleep_output(IDS[:2]) + b'{"slept_ms": 1}\n',
    "a blank line": sleep_output(IDS[:1]) + b"\n" + sleep_output(IDS[1:]),
    "no newline at the end": sleep_output(IDS).rstrip(b"\n"),
}


async def test_complete_refuses_an_output_that_does_not_answer_the_records(steps: LeaseSteps) -> None:
    await steps.submit_sleep("verified", IDS, subtask_size=3)
    executor_id = await steps.register("probe")
    lease = await steps.claim(executor_id)
    for what, body in WRONG_OUTPUTS.items():
        assert (await steps.put(lease["subtask"]["output"]["url"], body)).status == 200, what
        reply = await steps.complete(lease)
        assert reply.status == 422 and reply.code == "output_mismatch", (what, reply)
        # Nothing committed; the lease is still the executor's to finish.
        assert await steps.lease_state(executor_id, lease) == "ok", what
        assert await steps.task_status("verified") == "running", what

    # Fixed, the same lease completes.
    assert (await steps.put(lease["subtask"]["output"]["url"], sleep_output(IDS))).status == 200
    assert (await steps.complete(lease)).status == 200
    status, body, whole = await steps.results("verified")
    assert (status, whole) == (200, True)
    assert body == sleep_output(IDS)


async def test_a_refused_output_leaves_the_lease_to_be_failed(steps: LeaseSteps) -> None:
    """An empty object completed with `records: 3` is refused: it would give a completed task with 0
    result lines."""
    await steps.submit_sleep("empty", IDS, subtask_size=3)
    executor_id = await steps.register("probe")
    lease = await steps.claim(executor_id)
    assert (await steps.put(lease["subtask"]["output"]["url"], b"")).status == 200
    reply = await steps.complete(lease, records=3)
    assert reply.status == 422 and reply.code == "output_mismatch", reply
    assert "0 lines" in reply.body["error"]["message"]
    assert (await steps.end(lease, "fail")).status == 200  # still live, so it can be failed
    assert await steps.task_status("empty") != "completed"
    # Requeued (the failure was retryable): a conforming attempt completes it.
    again = await steps.claim(executor_id)
    assert again["subtask"]["attempt"] == 2
    assert (await steps.put(again["subtask"]["output"]["url"], sleep_output(IDS))).status == 200
    assert (await steps.complete(again)).status == 200
    status, body, whole = await steps.results("empty")
    assert (status, body, whole) == (200, sleep_output(IDS), True)


async def test_each_subtask_is_checked_against_its_own_records(steps: LeaseSteps) -> None:
    """Ids must be the subtask's own: another subtask's (valid) output is refused."""
    ids = [f"r{i}" for i in range(6)]
    await steps.submit_sleep("ranges", ids, subtask_size=3)
    executor_id = await steps.register("probe")
    first, second = await steps.claim(executor_id), await steps.claim(executor_id)
    assert [first["subtask"]["subtask_id"], second["subtask"]["subtask_id"]] == [0, 1]
    assert (await steps.put(second["subtask"]["output"]["url"], sleep_output(ids[:3]))).status == 200
    reply = await steps.complete(second)
    assert reply.status == 422 and reply.code == "output_mismatch", reply
    for lease, mine in ((first, ids[:3]), (second, ids[3:])):
        assert (await steps.put(lease["subtask"]["output"]["url"], sleep_output(mine))).status == 200
        assert (await steps.complete(lease)).status == 200
    status, body, whole = await steps.results("ranges")
    assert (status, body, whole) == (200, sleep_output(ids), True)
