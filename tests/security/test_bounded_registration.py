"""Registration is bounded. A `hardware` object is at most a few KB (its JSON; a
body over 1 MiB is not even decoded), one
executor token holds at most MINIONS_MAX_EXECUTORS_PER_TOKEN executor names and adds at most
MINIONS_REGISTRATIONS_PER_MINUTE new ones a minute (429 with Retry-After past it), enforced in the
database (sql/schema/05_executors.sql) so that API processes sharing it cannot together exceed a
bound. Registering a name the token holds again (an agent restarting) stays allowed, past both."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from minions.db.connect import connect
from minions.services.api.executors.registration import MAX_HARDWARE_BYTES, MAX_REGISTRATION_BYTES
from minions.testing.factories import make_token
from tests.support.api import ApiHarness, Reply, running_api


async def _register(api: ApiHarness, name: str, hardware: dict[str, Any] | None = None,
                    token: str = "executor") -> Reply:
    return await api.call("POST", "/api/v1/executors/register", token=token, json={
        "name": name, "hardware": hardware or {"os": "test", "device": "cpu"}, "kinds": ["sleep"]})


async def _names(api: ApiHarness) -> list[str]:
    reply = await api.call("GET", "/api/v1/executors")
    assert reply.status == 200, reply.body
    return sorted(e["name"] for e in reply.body["executors"])


async def test_a_hardware_object_over_the_cap_is_refused_and_not_stored(database_url: str, tmp_path: Path) -> None:
    async with running_api(database_url, tmp_path / "store") as api:
        big = await _register(api, "big", {"os": "test", "junk": "x" * 100_000})
        assert big.status == 422, big.body
        assert big.error["fields"]["hardware"] == f"at most {MAX_HARDWARE_BYTES:,} bytes as JSON"
        huge = await _register(api, "huge", {"os": "test", "junk": "x" * 24_000_000})  # a 24 MB hardware object
        assert huge.status == 413 and huge.error["code"] == "too_large", huge.body
        assert f"{MAX_REGISTRATION_BYTES:,} bytes" in huge.error["message"]
        just = await _register(api, "fits", {"os": "x" * (MAX_HARDWARE_BYTES - len('{"os":""}'))})
        assert just.status == 201, just.body
        assert await _names(api) == ["fits"]


async def test_the_defaults_stop_a_flood_of_new_names(database_url: str, tmp_path: Path) -> None:
    """A flood: 200 names from one token at once. Most are refused with 429, each saying
    when to come back; the token can still register each name it holds, and another token is free."""
    async with running_api(database_url, tmp_path / "store") as api:
        per_minute = api.settings.registrations_per_minute
        replies = await asyncio.gather(*(_register(api, f"flood-{i}") for i in range(200)))
        assert sorted({r.status for r in replies}) == [201, 429]
        assert sum(r.status == 201 for r in replies) == per_minute
        refused = next(r for r in replies if r.status == 429)
        assert refused.error["code"] == "too_many_registrations"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert f"{per_minute:,} new executor names" in refused.error["message"]
        assert len(await _names(api)) == per_minute

        held = next(i for i, r in enumerate(replies) if r.status == 201)
        again = await _register(api, f"flood-{held}")  # an agent restarting: same row
        assert again.status == 201 and again.body["executor_id"] == replies[held].body["executor_id"]
        conn = await connect(database_url)
        try:
            other, _ = await make_token(conn, "executor")
        finally:
            await conn.close()
        assert (await _register(api, "flood-0", token=other)).status == 201


async def test_a_token_holds_at_most_its_executors_across_api_processes(database_url: str, tmp_path: Path) -> None:
    """Two API processes on one database (two apps, each its own pool), 40 new names at once from
    one token: exactly the cap is registered. Then names it holds register again; new ones are 403."""
    cap = 10
    async with AsyncExitStack() as stack:
        apis = [await stack.enter_async_context(running_api(
            database_url, tmp_path / "store", max_executors_per_token=cap, registrations_per_minute=1000))
            for _ in range(2)]
        token = apis[0].executor  # one token, used through both processes
        replies = await asyncio.gather(*(_register(apis[i % 2], f"box-{i}", token=token) for i in range(40)))
        won = [i for i, r in enumerate(replies) if r.status == 201]
        assert len(won) == cap, [r.status for r in replies]
        refused = [r for r in replies if r.status != 201]
        assert {r.status for r in refused} == {403}
        assert refused[0].error["code"] == "too_many_executors"
        assert f"{cap:,} executor names" in refused[0].error["message"]

        again = await asyncio.gather(*(_register(apis[i % 2], f"box-{i}", token=token) for i in won))
        assert [r.status for r in again] == [201] * cap
        assert (await _register(apis[0], "one-more", token=token)).status == 403
        assert len(await _names(apis[0])) == cap


async def test_names_no_longer_in_use_leave_the_cap(database_url: str, tmp_path: Path) -> None:
    """The cap counts the executors a token uses (registered in the last 7 days, or heard from in the
    last day, sql/schema/06_leases.sql), not every name it ever registered: a fleet of short-lived hosts named after
    their hostname would otherwise reach it for good, with no way to remove names."""
    cap = 3
    async with running_api(database_url, tmp_path / "store", max_executors_per_token=cap) as api:
        for i in range(cap):
            assert (await _register(api, f"gone-{i}")).status == 201
        assert (await _register(api, "new")).status == 403
        conn = await connect(database_url)
        try:
            # gone-0 and gone-1 were last registered 8 days ago and have been silent since; gone-2
            # registered as long ago but still heartbeats.
            await conn.execute("""UPDATE executors SET registered_at = now() - interval '8 days'
                                   WHERE name LIKE 'gone-%'""")
            await conn.execute("""UPDATE heartbeats h SET beat_at = now() - interval '8 days',
                                         seen_at = now() - interval '8 days'
                                    FROM executors e
                                   WHERE e.id = h.executor_id AND e.name IN ('gone-0', 'gone-1')""")
        finally:
            await conn.close()
        assert (await _register(api, "new")).status == 201
        assert (await _register(api, "newer")).status == 201
        assert (await _register(api, "newest")).status == 403  # new, newer and gone-2 are in use


async def test_one_token_advertises_at_most_1024_distinct_models(database_url: str, tmp_path: Path) -> None:
    """Each advertised model is a known model and a capability every claim and /v1/models weighs: 10
    names of 1,024 models each made /v1/models take 5.9 s. Over its names together one token
    advertises at most 1,024 distinct models (422 on `models`, nothing registered); the same models
    again under more names are no new ones; another token is free; /v1/models lists them all."""
    async with running_api(database_url, tmp_path / "store") as api:
        def body(name: str, models: list[str]) -> dict[str, Any]:
            return {"name": name, "hardware": {"os": "test"}, "kinds": ["embedding"], "models": models}

        first = [f"m-{i}" for i in range(1000)]
        assert (await api.call("POST", "/api/v1/executors/register", token="executor",
                               json=body("a", first))).status == 201
        same = await api.call("POST", "/api/v1/executors/register", token="executor", json=body("b", first[:500]))
        assert same.status == 201, same.body
        over = await api.call("POST", "/api/v1/executors/register", token="executor",
                              json=body("c", [f"n-{i}" for i in range(25)]))
        assert over.status == 422 and "1,024 distinct models" in over.error["fields"]["models"], over.body
        assert await _names(api) == ["a", "b"]
        # Re-registering a held name with other models counts that name's new models, not its old ones.
        moved = await api.call("POST", "/api/v1/executors/register", token="executor",
                               json=body("b", [f"n-{i}" for i in range(24)]))
        assert moved.status == 201, moved.body
        conn = await connect(database_url)
        try:
            other, _ = await make_token(conn, "executor")
        finally:
            await conn.close()
        elsewhere = await api.call("POST", "/api/v1/executors/register", token=other,
                                   json=body("d", [f"o-{i}" for i in range(1024)]))
        assert elsewhere.status == 201, elsewhere.body
        listed = await api.call("GET", "/v1/models")
        assert listed.status == 200 and len(listed.body["data"]) == 1000 + 24 + 1024, len(listed.body["data"])
