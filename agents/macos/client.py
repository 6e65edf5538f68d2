"""HTTP client of the executor protocol (API.md), and of the presigned object-store URLs.

Transient trouble (connection refused or reset, timeouts, 429, 5xx) is retried forever with
capped exponential backoff, or after the server's `Retry-After` when it sends one: an agent on a
laptop outlives server restarts and Wi-Fi changes and never crashes over them. Answers that
retrying cannot fix become exceptions: 401/403 is fatal (`AuthError`), 409 means a lease or
executor is gone (`Conflict`), other 4xx (`Rejected`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any

import aiohttp
import yarl

from minions import jsoncodec, protocol
from minions.agents.macos.protocol import (
    Claim,
    InputRef,
    Registration,
    parse_claim,
    parse_claims,
    parse_registration,
)
from minions.backoff import Backoff
from minions.logging import get_logger
from minions.retry_after import retry_after_s

log = get_logger(__name__)

_TRANSIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_API_TIMEOUT = aiohttp.ClientTimeout(total=60, sock_connect=10)
# Input ranges and outputs can be many MB on a slow link: bound silence, not total time.
_STORE_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
# A long-poll claim legitimately stays silent for `wait` seconds; allow this much on top.
_CLAIM_GRACE_S = 30.0


class ClientError(Exception):
    """Base of the errors this client raises."""


class AuthError(ClientError):
    """The server refused the token (401) or its role (403): fatal, retrying cannot help."""


class Quarantined(AuthError):
    """403 `quarantined`: the token is fine, but the pool quarantined this executor (its results lost
    quorums of spot checks); an admin may release it. Fatal as any refusal, said as what it is."""


class Rejected(ClientError):
    """A 4xx answer other than 401/403: the request itself is wrong or its object is gone."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class Conflict(Rejected):
    """409: the lease is no longer current (or the executor deregistered); drop the work."""


class NotFound(Rejected):
    """404: e.g. the executor row is gone (a reset server); the agent registers again."""


class StorageError(ClientError):
    """The object store refused a presigned URL (expired, forbidden, missing)."""


class ExecutorClient:
    """One agent's connection to the API; use as `async with ExecutorClient(...) as client`."""

    def __init__(self, api_url: str, token: str, *, backoff: Backoff | None = None) -> None:
        self._base = api_url.rstrip("/") + "/api/v1"
        # The bearer token goes to the API only, never to the object store (invariant 5, and S3
        # rejects a presigned request that carries a second Authorization).
        self._auth = {"Authorization": f"Bearer {token}"}
        self._backoff = backoff or Backoff(first_s=0.5, max_s=30.0)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ExecutorClient:
        self._session = aiohttp.ClientSession(raise_for_status=False)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("ExecutorClient used outside `async with`")
        return self._session

    # -- the executor protocol -------------------------------------------------------------

    async def register(self, payload: dict[str, Any]) -> Registration:
        _, body = await self._api("POST", "/executors/register", payload)
        return parse_registration(body)

    async def claim(self, executor_id: str, wait_s: float) -> Claim | None:
        """A lease, or None when nothing came within `wait_s` (204)."""
        timeout = aiohttp.ClientTimeout(total=wait_s + _CLAIM_GRACE_S, sock_connect=10)
        status, body = await self._api(
            "POST",
            f"/executors/{executor_id}/claim",
            None,
            params={"wait": f"{wait_s:g}"},
            client_timeout=timeout,
        )
        return None if status == 204 else parse_claim(body)

    async def claim_batch(self, executor_id: str, wait_s: float, most: int) -> list[Claim]:
        """Up to `most` leases (as many as are pending once there is one), or [] when nothing came
        within `wait_s`. Each task's params come once per answer (`params=once`), each lease gets them."""
        timeout = aiohttp.ClientTimeout(total=wait_s + _CLAIM_GRACE_S, sock_connect=10)
        status, body = await self._api(
            "POST",
            f"/executors/{executor_id}/claim",
            None,
            params={"wait": f"{wait_s:g}", "max": str(most), "params": "once"},
            client_timeout=timeout,
        )
        if status == 204:
            return []
        return parse_claims(body)

    async def heartbeat(self, executor_id: str, tokens: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """The state of each held lease (ok, lost or cancelled; one the answer leaves out is lost), and
        the fresh input URLs the server sent for leases it renewed (`input_urls`; none for a lease whose
        input rode inline)."""
        _, body = await self._api("POST", f"/executors/{executor_id}/heartbeat",
                                  protocol.to_builtins(protocol.Heartbeat(leases=tokens)))
        states = body.get("leases", {}) if isinstance(body, dict) else {}
        urls = body.get("input_urls") if isinstance(body, dict) else None
        renewed = {token: url for token, url in urls.items()
                   if token in tokens and isinstance(url, str) and url} if isinstance(urls, dict) else {}
        return {token: str(states.get(token, "lost")) for token in tokens}, renewed

    async def complete(self, token: str, records: int, seconds: float, output: bytes | None = None) -> None:
        """Commit a lease whose output was PUT, or carry the (small) output inline."""
        message = protocol.Completion(records=records, seconds=round(seconds, 3),
                                      output=None if output is None else output.decode())
        await self._api("POST", f"/leases/{token}/complete", protocol.to_builtins(message))

    async def fail(self, token: str, error: str, retryable: bool) -> None:
        await self._api("POST", f"/leases/{token}/fail",
                        protocol.to_builtins(protocol.Failure(error=error, retryable=retryable)))

    async def release(self, token: str) -> None:
        await self._api("POST", f"/leases/{token}/release", None)

    async def complete_batch(self, completions: list[protocol.LeaseCompletion]) -> dict[str, Rejected | None]:
        """Many leases in one request: each lease's outcome by token (None: committed; else the error
        its own request would have raised, as a Rejected to inspect, not raised)."""
        _, body = await self._api("POST", "/leases/complete",
                                  protocol.to_builtins(protocol.CompletionBatch(leases=completions)))
        reply = protocol.convert(body, protocol.BatchReply)
        return {r.token: None if r.error is None else _rejection(r.status, r.error.code, r.error.message)
                for r in reply.results}

    async def deregister(self, executor_id: str) -> None:
        await self._api("POST", f"/executors/{executor_id}/deregister", None)

    # -- the object store, through presigned URLs ------------------------------------------

    async def download(self, ref: InputRef) -> bytes:
        """The bytes [start, end) of the input object."""
        size = ref.end - ref.start
        if size <= 0:
            return b""
        if ref.data is not None:  # sent inline with the claim
            return ref.data.encode()
        if ref.url is None:  # parse_claim(s) refuses such an answer; never a GET of nothing
            raise protocol.ProtocolError("an input with neither a URL nor inline data")
        # Exactly this header: an S3 input URL is signed with it, and the local store's serves this
        # range alone.
        headers = {"Range": f"bytes={ref.start}-{ref.end - 1}"}
        attempt = 0
        while True:
            # `ref.url` read at every try: a heartbeat may have renewed it meanwhile (the agent writes
            # the server's `input_urls` into the lease it holds).
            status, body = await self._store_request("GET", lambda: ref.url or "", headers=headers,
                                                     attempt=attempt)
            if status == 200:
                body = body[ref.start : ref.end]  # a store that ignores Range sends the whole object
            if status in (200, 206) and len(body) == size:
                return body
            if status in (200, 206):
                reason = f"short body: {len(body)} of {size} bytes"
            else:
                reason = f"HTTP {status}"
            attempt = await self._pause("store_retry", "GET", reason, attempt)

    async def upload(self, url: str, body: bytes) -> None:
        """One PUT of the whole output object."""
        await self._store_request("PUT", url, data=body, attempt=0)

    # -- plumbing -------------------------------------------------------------------------

    async def _api(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | None,
        *,
        params: dict[str, str] | None = None,
        client_timeout: aiohttp.ClientTimeout = _API_TIMEOUT,
    ) -> tuple[int, Any]:
        url = self._base + path
        headers = dict(self._auth)
        data: bytes | None = None
        if payload is not None:
            data = jsoncodec.dumps(payload)
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            asked: float | None = None
            try:
                async with self.session.request(
                    method, url, data=data, headers=headers, params=params, timeout=client_timeout
                ) as response:
                    status, raw = response.status, await response.read()
                    asked = retry_after_s(response.headers)
            except _TRANSIENT_ERRORS as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if status < 500 and status != 429:
                    return status, _answer(status, raw, method, path)
                reason = f"HTTP {status}"
            attempt = await self._pause("api_retry", f"{method} {path}", reason, attempt, asked)

    async def _store_request(
        self,
        method: str,
        url: str | Callable[[], str],
        *,
        attempt: int,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[int, bytes]:
        """`url`: the URL, or where to read it at each try (one a heartbeat renews)."""
        while True:
            # Presigned URLs are already percent-encoded; yarl must not encode them again (it would
            # turn %2F in the signature into %252F and break it).
            target = yarl.URL(url() if callable(url) else url, encoded=True)
            asked: float | None = None
            try:
                async with self.session.request(
                    method, target, headers=headers, data=data, timeout=_STORE_TIMEOUT
                ) as response:
                    status, raw = response.status, await response.read()
                    asked = retry_after_s(response.headers)
            except _TRANSIENT_ERRORS as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if 200 <= status < 300:
                    return status, raw
                if status < 500 and status != 429:
                    raise StorageError(f"object store answered HTTP {status} to {method}: {_snippet(raw)}")
                reason = f"HTTP {status}"
            attempt = await self._pause("store_retry", method, reason, attempt, asked)

    async def _pause(self, event: str, what: str, reason: str, attempt: int,
                     retry_after: float | None = None) -> int:
        # A server that says when to come back (503/429 with Retry-After) is believed: the whole
        # fleet then returns when it can serve, not on each agent's shorter backoff.
        delay = retry_after if retry_after is not None else self._backoff.delay(attempt)
        log.warning(event, request=what, reason=reason, attempt=attempt + 1, retry_in_s=round(delay, 2))
        await asyncio.sleep(delay)
        return attempt + 1


def _answer(status: int, raw: bytes, method: str, path: str) -> Any:
    """The decoded body of a 2xx answer, or the exception a 4xx answer stands for."""
    if 200 <= status < 300:
        return jsoncodec.loads(raw) if raw.strip() else None
    code, message = _error_fields(raw)
    if status == 403 and code == "quarantined":
        raise Quarantined(f"the pool quarantined this executor ({message}); its token is fine: an admin of the "
                          "pool decides (`minions executors` shows why, `minions executor release` lifts it)")
    if status in (401, 403):
        raise AuthError(
            f"the API refused this agent's token on {method} {path} (HTTP {status} {code}: {message}); "
            "check MINIONS_TOKEN / --token: it must be an executor (or admin) token, e.g. from "
            "`minions token create --role executor`"
        )
    raise _rejection(status, code, message)


def _rejection(status: int, code: str, message: str) -> Rejected:
    if status == 409:
        return Conflict(status, code, message)
    if status == 404:
        return NotFound(status, code, message)
    return Rejected(status, code, message)


def _error_fields(raw: bytes) -> tuple[str, str]:
    """The error's code, and its message with any field errors (a 422 names the setting at fault)."""
    try:
        error = jsoncodec.loads(raw)["error"]
        fields = error.get("fields") or {}
        detail = "".join(f"; {key}: {why}" for key, why in fields.items())
        return str(error.get("code", "error")), str(error.get("message", "")) + detail
    except (jsoncodec.JSONDecodeError, KeyError, TypeError, AttributeError):
        return "error", _snippet(raw)


def _snippet(raw: bytes, limit: int = 300) -> str:
    return raw[:limit].decode("utf-8", "replace")
