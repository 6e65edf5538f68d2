"""An async client of API.md's user endpoints (tasks, results, executors, inputs).

Errors come back as `MinionsError` carrying the server's status, code, message and field errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import aiohttp

from minions import jsoncodec


class MinionsError(Exception):
    def __init__(self, status: int, code: str, message: str, fields: dict[str, str] | None = None) -> None:
        detail = "".join(f"\n  {k}: {v}" for k, v in (fields or {}).items())
        super().__init__(f"{status} {code}: {message}{detail}")
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields or {}


class MinionsClient:
    def __init__(self, api_url: str, token: str, *, timeout_s: float = 60.0) -> None:
        self.api_url = api_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> MinionsClient:
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self._session

    async def _request(self, method: str, path: str, *, json: Any = None, data: Any = None,
                       params: dict[str, str] | None = None, headers: dict[str, str] | None = None) -> Any:
        body = jsoncodec.dumps(json) if json is not None else data
        hdrs = dict(headers or {})
        if json is not None:
            hdrs["Content-Type"] = "application/json"
        async with self.session.request(method, self.api_url + path, data=body, params=params,
                                        headers=hdrs) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise _error(resp.status, raw)
            return jsoncodec.loads(raw) if raw else None

    # Tasks -------------------------------------------------------------------------------------
    async def submit(self, task: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("POST", "/api/v1/tasks", json=task)
        return result

    async def task(self, team: str, project: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", f"/api/v1/tasks/{team}/{project}/{name}")
        return result

    async def tasks(self, *, team: str | None = None, project: str | None = None, status: str | None = None,
                    limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("team", team), ("project", project), ("status", status),
                                    ("cursor", cursor), ("limit", str(limit))) if v is not None}
        result: dict[str, Any] = await self._request("GET", "/api/v1/tasks", params=params)
        return result

    async def cancel(self, team: str, project: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("POST", f"/api/v1/tasks/{team}/{project}/{name}/cancel")
        return result

    async def results(self, team: str, project: str, name: str, *, partial: bool = False
                      ) -> AsyncIterator[bytes]:
        """The results stream, chunk by chunk (JSONL)."""
        params = {"partial": "true"} if partial else None
        async with self.session.get(f"{self.api_url}/api/v1/tasks/{team}/{project}/{name}/results",
                                    params=params) as resp:
            if resp.status >= 400:
                raise _error(resp.status, await resp.read())
            async for chunk in resp.content.iter_chunked(1 << 16):
                yield chunk

    async def upload_input(self, chunks: AsyncIterator[bytes] | bytes, *, sha256: str | None = None) -> str:
        """Upload JSONL; with `sha256` (of the whole body) it is stored under that hash, so the same
        bytes give the same URI (and the server skips an upload it already has)."""
        result = await self._request("POST", "/api/v1/inputs", data=chunks,
                                     params={"sha256": sha256} if sha256 else None,
                                     headers={"Content-Type": "application/x-ndjson"})
        uri: str = result["uri"]
        return uri

    # Executors and health ----------------------------------------------------------------------
    async def executors(self, team: str | None = None) -> list[dict[str, Any]]:
        params = {"team": team} if team else None
        result = await self._request("GET", "/api/v1/executors", params=params)
        executors: list[dict[str, Any]] = result["executors"]
        return executors

    async def health(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", "/api/v1/health")
        return result


def _error(status: int, raw: bytes) -> MinionsError:
    try:
        error = jsoncodec.loads(raw)["error"]
        return MinionsError(status, error.get("code", "error"), error.get("message", ""), error.get("fields"))
    except (ValueError, KeyError, TypeError):
        return MinionsError(status, "http_error", raw.decode(errors="replace")[:500])
