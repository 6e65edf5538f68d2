"""Tokens can be listed (never their secret), revoked and made to expire, and a
revocation bites on every API process within a second (a NOTIFY drops the processes' cached
entries), not after the ten seconds of the per-process cache. Two real API processes, one database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest_asyncio

from minions import jsoncodec
from minions.db.connect import connect
from minions.embedded_pg import free_port
from minions.sdk.health import wait_until_healthy
from minions.testing.factories import make_token
from minions.testing.processes import Service, Services
from tests.support.paths import REPO

REVOCATION_BOUND_S = 1.0  # the bound: every process refuses a revoked token within 1 s


@dataclass
class TwoApis:
    urls: tuple[str, str]
    database_url: str
    admin: str
    http: aiohttp.ClientSession

    async def status(self, url: str, token: str, method: str = "GET", path: str = "/api/v1/tasks",
                     body: object = None) -> tuple[int, object]:
        headers = {"Authorization": f"Bearer {token}"}
        data = None if body is None else jsoncodec.dumps(body)
        if data is not None:
            headers["Content-Type"] = "application/json"
        async with self.http.request(method, url + path, data=data, headers=headers) as resp:
            raw = await resp.read()
            return resp.status, jsoncodec.loads(raw) if raw and resp.content_type == "application/json" else raw


@pytest_asyncio.fixture
async def apis(services: Services) -> AsyncIterator[TwoApis]:
    services.workdir.mkdir(parents=True, exist_ok=True)
    services.start("api")
    second_port = free_port()
    second = Service("api-2", "minions.services.api", {**services.env(), "MINIONS_PORT": str(second_port)},
                     services.workdir / "api-2.log").start()
    services.running["api-2"] = second  # stopped with the others
    await services.wait_healthy()
    second_url = f"http://127.0.0.1:{second_port}"
    assert await wait_until_healthy(second_url, 30), second.log()[-3000:]
    conn = await connect(services.database_url)
    try:
        admin, _ = await make_token(conn, "admin")
    finally:
        await conn.close()
    async with aiohttp.ClientSession() as http:
        yield TwoApis((services.api_url, second_url), services.database_url, admin, http)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minions.cli.main", "token", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


async def _user_token(apis: TwoApis) -> tuple[str, int]:
    conn = await connect(apis.database_url)
    try:
        return await make_token(conn, "user", "search")
    finally:
        await conn.close()


async def _warm_both(apis: TwoApis, token: str) -> None:
    """Use the token on both processes (twice), so each holds it in its cache."""
    for _ in range(2):
        for url in apis.urls:
            status, body = await apis.status(url, token)
            assert status == 200, body


async def _refused_everywhere_within(apis: TwoApis, token: str, bound_s: float) -> float:
    """Seconds until both processes answer 401 to `token`; fails past `bound_s`."""
    start = time.monotonic()
    pending = set(apis.urls)
    while pending:
        for url in list(pending):
            status, _ = await apis.status(url, token)
            if status == 401:
                pending.discard(url)
        elapsed = time.monotonic() - start
        if pending and elapsed > bound_s:
            raise AssertionError(f"{sorted(pending)} still accepted the revoked token {elapsed:.2f} s after "
                                 f"its revocation committed (bound: {bound_s} s)")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def test_a_revocation_through_the_api_bites_on_both_processes_within_a_second(apis: TwoApis) -> None:
    token, token_id = await _user_token(apis)
    await _warm_both(apis, token)
    # Revoked through the first process; the second hears of it only through the database.
    status, body = await apis.status(apis.urls[0], apis.admin, "POST", f"/api/v1/tokens/{token_id}/revoke")
    assert status == 200, body
    assert isinstance(body, dict) and body["status"] == "revoked" and body["id"] == token_id
    await _refused_everywhere_within(apis, token, REVOCATION_BOUND_S)


async def test_a_revocation_with_the_cli_bites_on_both_processes_within_a_second(apis: TwoApis) -> None:
    token, token_id = await _user_token(apis)
    other, _ = await _user_token(apis)
    await _warm_both(apis, token)
    await _warm_both(apis, other)
    done = await asyncio.to_thread(cli, "revoke", str(token_id), "--database-url", apis.database_url)
    assert done.returncode == 0, done.stderr
    await _refused_everywhere_within(apis, token, REVOCATION_BOUND_S)
    for url in apis.urls:  # only that token
        assert (await apis.status(url, other))[0] == 200


async def test_a_list_never_shows_a_secret(apis: TwoApis) -> None:
    status, created = await apis.status(apis.urls[0], apis.admin, "POST", "/api/v1/tokens",
                                        {"role": "user", "team": "search", "label": "ci pipeline"})
    assert status == 201, created
    assert isinstance(created, dict)
    secret = created["token"]
    assert secret.startswith(created["prefix"]) and len(created["prefix"]) < len(secret) // 4
    assert (await apis.status(apis.urls[1], secret))[0] == 200

    status, listed = await apis.status(apis.urls[1], apis.admin, "GET", "/api/v1/tokens")
    assert status == 200
    raw = jsoncodec.dumps(listed).decode()
    assert secret not in raw and secret[:20] not in raw
    assert isinstance(listed, dict)
    mine = [t for t in listed["tokens"] if t["id"] == created["id"]]
    assert mine and "token" not in mine[0] and mine[0]["label"] == "ci pipeline" and mine[0]["status"] == "active"

    shown = await asyncio.to_thread(cli, "list", "--database-url", apis.database_url)
    assert shown.returncode == 0, shown.stderr
    assert secret not in shown.stdout and secret[:20] not in shown.stdout
    assert "ci pipeline" in shown.stdout and created["prefix"] in shown.stdout


async def test_a_token_has_an_owner_and_only_an_executor_token_is_vouched_for(apis: TwoApis) -> None:
    """Spot checks count owners and trust vouched machines: the API and the CLI make them
    alike, refuse `trusted` for another role, and lists show both."""
    url = apis.urls[0]
    status, made = await apis.status(url, apis.admin, "POST", "/api/v1/tokens",
                                     {"role": "executor", "owner": "acme lab", "trusted": True})
    assert status == 201 and isinstance(made, dict), made
    assert (made["owner"], made["trusted"]) == ("acme lab", True)
    status, refused = await apis.status(url, apis.admin, "POST", "/api/v1/tokens", {"role": "user", "trusted": True})
    assert status == 422 and isinstance(refused, dict) and "trusted" in refused["error"]["fields"], refused
    status, refused = await apis.status(url, apis.admin, "POST", "/api/v1/tokens",
                                        {"role": "executor", "owner": "token:7"})
    assert status == 422 and isinstance(refused, dict) and "owner" in refused["error"]["fields"], refused
    status, plain = await apis.status(url, apis.admin, "POST", "/api/v1/tokens", {"role": "executor"})
    assert status == 201 and isinstance(plain, dict)
    assert (plain["owner"], plain["trusted"]) == (f"token:{plain['id']}", False)  # its own owner, a volunteer

    made_cli = await asyncio.to_thread(cli, "create", "--role", "executor", "--trusted", "--owner", "acme lab",
                                       "--database-url", apis.database_url)
    assert made_cli.returncode == 0, made_cli.stderr
    wrong = await asyncio.to_thread(cli, "create", "--role", "user", "--trusted", "--database-url", apis.database_url)
    assert wrong.returncode != 0 and "--trusted is for executor tokens" in wrong.stderr
    listed = await asyncio.to_thread(cli, "list", "--json", "--database-url", apis.database_url)
    rows = jsoncodec.loads(listed.stdout)
    assert sum(1 for t in rows if t["owner"] == "acme lab" and t["trusted"]) == 2
    shown = await asyncio.to_thread(cli, "list", "--database-url", apis.database_url)
    assert "trusted" in shown.stdout and "volunteer" in shown.stdout and "acme lab" in shown.stdout


async def test_an_expiring_token_stops_working_when_it_expires(apis: TwoApis) -> None:
    made = await asyncio.to_thread(cli, "create", "--role", "user", "--team", "search", "--expires-in", "3s",
                                   "--database-url", apis.database_url)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    lived_until = time.monotonic() + 3.0
    await _warm_both(apis, token)  # cached now: the cache must not outlive the expiry
    await asyncio.sleep(max(0.0, lived_until - time.monotonic()) + 0.3)
    for url in apis.urls:
        assert (await apis.status(url, token))[0] == 401
    listed = await asyncio.to_thread(cli, "list", "--status", "expired", "--json", "--database-url",
                                     apis.database_url)
    assert listed.returncode == 0, listed.stderr
    assert [t["role"] for t in jsoncodec.loads(listed.stdout)] == ["user"]


async def test_only_an_admin_manages_tokens_and_never_revokes_its_own_in_hand(apis: TwoApis) -> None:
    user, _ = await _user_token(apis)
    url = apis.urls[0]
    assert (await apis.status(url, user, "GET", "/api/v1/tokens"))[0] == 403
    assert (await apis.status(url, user, "POST", "/api/v1/tokens", {"role": "admin"}))[0] == 403
    status, listed = await apis.status(url, apis.admin, "GET", "/api/v1/tokens")
    assert isinstance(listed, dict)
    admin_id = next(t["id"] for t in listed["tokens"] if t["role"] == "admin")
    status, body = await apis.status(url, apis.admin, "POST", f"/api/v1/tokens/{admin_id}/revoke")
    assert status == 409 and isinstance(body, dict) and body["error"]["code"] == "own_token"
    assert (await apis.status(url, apis.admin, "POST", "/api/v1/tokens/999999/revoke"))[0] == 404
    status, body = await apis.status(url, apis.admin, "POST", "/api/v1/tokens",
                                     {"role": "user", "expires_in_s": -1, "team": "no/slash"})
    assert status == 422 and isinstance(body, dict)
    assert set(body["error"]["fields"]) == {"expires_in_s", "team"}
