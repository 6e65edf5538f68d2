"""A lease's input URL reads its lease's range alone, and only while it holds it.

Before, the input GET URL was signed for the whole object and lasted 12 h: after its lease was lost it
still answered 206, and without a `Range` header it returned the whole object (600 records for a
lease of 300). Now the local store signs the lease token and the byte range into the URL
(minions/store/signing.py): no Range is the signed range, a Range outside it is 416
`range_not_signed`, an edited range is 403 `bad_signature`, and once the lease is not live the URL
answers 403 `lease_ended` (sql/schema/08_inputs.sql). On S3, which knows nothing of leases, the URL
lasts the lease timeout plus MINIONS_INPUT_URL_MARGIN_S, a heartbeat that renews the lease sends a
fresh one, and the Range header is signed (moto checks neither signatures nor expiry: asserted on the
URL's X-Amz-SignedHeaders and X-Amz-Expires).

Real services (API, splitter, watchdog as processes) on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
import yarl

from minions import jsoncodec
from minions.db.connect import connect
from minions.testing.factories import make_tokens
from minions.testing.processes import Services
from minions.testing.waiting import eventually
from tests.support.leases import LeaseSteps, Reply
from tests.support.s3 import FAKE_ENV, moto_server

BUCKET = "minions-input-urls"
IDS = [f"r{i:03d}" for i in range(600)]
# Inline records as an input object (not kept in the database), and no range inline in a claim's
# answer: every lease reads its input through its URL, and heartbeats renew it.
OBJECT_INPUTS = {"MINIONS_INPUT_IN_DATABASE_BYTES": "0", "MINIONS_INLINE_INPUT_BYTES": "0"}
LEASE_TIMEOUT_S = 120.0
MARGIN_S = 60.0  # MINIONS_INPUT_URL_MARGIN_S's default


async def _steps(services: Services, session: aiohttp.ClientSession) -> LeaseSteps:
    await services.start_all()
    admin, executor = await make_tokens(services.database_url)
    return LeaseSteps(services.api_url, admin, executor, session)


async def _get(session: aiohttp.ClientSession, url: str, range_header: str | None = None) -> Reply:
    headers = {} if range_header is None else {"Range": range_header}
    async with session.get(yarl.URL(url, encoded=True), headers=headers) as resp:
        raw = await resp.read()
        return Reply(resp.status, jsoncodec.loads(raw) if resp.content_type == "application/json" else raw)


def _query(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}


def _ids(body: bytes) -> list[str]:
    return [jsoncodec.loads(line)["id"] for line in body.splitlines()]


async def _leased(steps: LeaseSteps, name: str) -> tuple[str, dict[str, Any], list[str]]:
    """A task of 600 records in two subtasks of 300; an executor and its lease of one of them, and the
    ids that lease answers for."""
    await steps.submit_sleep(name, IDS, subtask_size=300)
    executor_id = await steps.register(f"{name}-probe")
    lease = await steps.claim(executor_id)
    assert lease["subtask"]["input"]["url"] and lease["subtask"]["input"].get("data") is None
    first = lease["subtask"]["subtask_id"] * 300
    return executor_id, lease, IDS[first:first + 300]


@pytest.fixture
async def local(database_url: str, tmp_path: Path) -> AsyncIterator[LeaseSteps]:
    # A long lease timeout: the probes pause between steps without heartbeating.
    services = Services(database_url, tmp_path / "services", lease_timeout_s=LEASE_TIMEOUT_S,
                        extra_env=OBJECT_INPUTS)
    try:
        async with aiohttp.ClientSession() as session:
            yield await _steps(services, session)
    finally:
        services.stop_all()


async def test_an_input_url_reads_its_leases_range_and_nothing_else(local: LeaseSteps) -> None:
    steps = local
    _, lease, mine = await _leased(steps, "scoped")
    url = lease["subtask"]["input"]["url"]
    start, end = lease["subtask"]["input"]["range"]

    # No Range: the lease's 300 records, not the object's 600.
    whole = await _get(steps.session, url)
    assert whole.status == 206, whole.body
    assert _ids(whole.body) == mine
    # The range as the protocol says to ask for it, and a part of it.
    assert (await _get(steps.session, url, f"bytes={start}-{end - 1}")).body == whole.body
    part = await _get(steps.session, url, f"bytes={start}-{start + 99}")
    assert part.status == 206 and part.body == whole.body[:100]

    # Any byte outside: refused (the whole object, the other lease's range, one byte beyond this one).
    other = f"bytes={end}-" if start == 0 else f"bytes=0-{start - 1}"
    for outside in ("bytes=0-", other, f"bytes={start - 1}-{end - 1}" if start else f"bytes=0-{end}"):
        refused = await _get(steps.session, url, outside)
        assert refused.status == 416, (outside, refused.status)
        assert refused.code == "range_not_signed", refused.body

    # The URL's range edited, or its scope taken off (a whole-object URL): its signature no longer matches.
    q = _query(url)
    scope = f"&token={q['token']}&start={q['start']}&end={q['end']}"
    assert scope in url
    for edited in (f"&token={q['token']}&start=0&end=999999999",
                   f"&token={q['token']}&start={int(q['start']) + 1}&end={q['end']}",
                   f"&token={q['token']}&start={q['start']}&end={int(q['end']) + 1}", ""):
        tampered = await _get(steps.session, url.replace(scope, edited))
        assert tampered.status == 403 and tampered.code == "bad_signature", (edited, tampered.body)


async def test_an_input_url_stops_working_once_its_lease_ends(local: LeaseSteps) -> None:
    steps = local
    executor_id, lease, mine = await _leased(steps, "ended")
    url = lease["subtask"]["input"]["url"]
    token = lease["lease"]["token"]

    # While the lease is live, a heartbeat renews its URL: a fresh one, scoped alike.
    beat = await steps.call("POST", f"/api/v1/executors/{executor_id}/heartbeat", steps.executor,
                            {"leases": [token]})
    assert beat.body["leases"] == {token: "ok"}
    renewed = beat.body["input_urls"][token]
    assert _query(renewed)["token"] == token
    assert _ids((await _get(steps.session, renewed)).body) == mine

    assert (await steps.end(lease, "release")).status == 200
    for gone in (url, renewed):
        refused = await _get(steps.session, gone)
        assert refused.status == 403 and refused.code == "lease_ended", refused.body
    beat = await steps.call("POST", f"/api/v1/executors/{executor_id}/heartbeat", steps.executor,
                            {"leases": [token]})
    assert beat.body == {"leases": {token: "lost"}}  # no URL for a lease no longer held

    # The next holder's URL works; the old one still does not (the lease, not the subtask, is the key).
    again = await steps.claim(executor_id)
    if again["subtask"]["subtask_id"] == lease["subtask"]["subtask_id"]:
        assert _ids((await _get(steps.session, again["subtask"]["input"]["url"])).body) == mine
    assert (await _get(steps.session, url)).status == 403


async def test_a_lost_leases_input_url_answers_403(database_url: str, tmp_path: Path) -> None:
    # The lease timeout of 3 s passes without a heartbeat: the watchdog reclaims the lease (lost).
    services = Services(database_url, tmp_path / "services", extra_env=OBJECT_INPUTS)
    try:
        async with aiohttp.ClientSession() as session:
            steps = await _steps(services, session)
            _, lease, mine = await _leased(steps, "lost")
            url = lease["subtask"]["input"]["url"]
            start, end = lease["subtask"]["input"]["range"]
            assert _ids((await _get(session, url, f"bytes={start}-{end - 1}")).body) == mine
            conn = await connect(database_url)
            try:
                async def reclaimed() -> bool:
                    return not await conn.fetchval("SELECT count(*) FROM subtasks WHERE lease_token = $1",
                                                   lease["lease"]["token"])
                await eventually(reclaimed, "the watchdog to reclaim the silent lease")
            finally:
                await conn.close()
            refused = await _get(session, url)
            assert refused.status == 403 and refused.code == "lease_ended", refused.body
    finally:
        services.stop_all()


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    with moto_server(BUCKET) as endpoint:
        yield endpoint


async def test_on_s3_an_input_url_lives_about_as_long_as_its_lease_and_signs_its_range(
        database_url: str, tmp_path: Path, s3_endpoint: str) -> None:
    services = Services(database_url, tmp_path / "services", lease_timeout_s=LEASE_TIMEOUT_S,
                        store=f"s3://{BUCKET}/minions",
                        extra_env={**FAKE_ENV, "MINIONS_S3_ENDPOINT_URL": s3_endpoint, **OBJECT_INPUTS})
    try:
        async with aiohttp.ClientSession() as session:
            steps = await _steps(services, session)
            executor_id, lease, mine = await _leased(steps, "s3-scoped")
            url = lease["subtask"]["input"]["url"]
            start, end = lease["subtask"]["input"]["range"]
            query = _query(url)
            # The lease's lifetime plus the margin, not 12 h; a request without this very Range header
            # fails S3's signature check (moto checks none, so the URL says it).
            assert int(query["X-Amz-Expires"]) == LEASE_TIMEOUT_S + MARGIN_S, query
            assert query["X-Amz-SignedHeaders"] == "host;range", query
            got = await _get(session, url, f"bytes={start}-{end - 1}")
            assert got.status == 206 and _ids(got.body) == mine

            token = lease["lease"]["token"]
            beat = await steps.call("POST", f"/api/v1/executors/{executor_id}/heartbeat", steps.executor,
                                    {"leases": [token]})
            renewed = _query(beat.body["input_urls"][token])
            assert int(renewed["X-Amz-Expires"]) == LEASE_TIMEOUT_S + MARGIN_S
            assert renewed["X-Amz-SignedHeaders"] == "host;range"
            assert renewed["X-Amz-Date"] >= query["X-Amz-Date"]
            assert (await steps.end(lease, "release")).status == 200
            beat = await steps.call("POST", f"/api/v1/executors/{executor_id}/heartbeat", steps.executor,
                                    {"leases": [token]})
            assert beat.body == {"leases": {token: "lost"}}
    finally:
        services.stop_all()
