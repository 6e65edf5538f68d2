"""An async client of API.md's user endpoints (tasks, results, executors, inputs).

Two layers on one connection:
- typed, for pipelines: `submit(records, team=…, …)` takes a path, JSONL bytes, an iterable of
  dicts or a table (minions.sdk.tables), checks each record, and returns a `Task`; `wait()` (with a
  progress bar if asked), `iter_results()` (one typed result per input record, in input order) and
  `results(task)` (the same as arrays and tables: minions.sdk.results);
- raw, for tools that print or forward the wire JSON (the CLI's `--json`): `submit(body)`, `task()`,
  `tasks()`, `cancel()`, `results(team, project, name)` (JSONL chunks), `upload_input()`, `executors()`, `health()`.

A 503 or 429 is retried after the server's `Retry-After` (backoff when it sends none), as is a
connection that could not be made; errors come back as `MinionsError` carrying the server's status,
code, message and field errors. `SyncMinionsClient` (minions.sdk.sync) is the same for scripts and
notebooks.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, overload
from urllib.parse import quote

import aiohttp

from minions import config, jsoncodec
from minions.backoff import Backoff
from minions.kinds import FINISHED_TASK_STATUSES
from minions.retry_after import retry_after_s
from minions.sdk.inputs import Body, InputSource, jsonl_body
from minions.sdk.objects import Result, Task, TaskRef, UnknownResult, result_from_json, task_parts
from minions.sdk.parts import Progress, fetch_parts
from minions.sdk.progress import ProgressBar
from minions.sdk.results import Results
from minions.sdk.tables import TableSource, is_table, table_records
from minions.up_json import read_up_json

DEFAULT_API_URL = "http://127.0.0.1:8080"


class MinionsError(Exception):
    def __init__(self, status: int, code: str, message: str, fields: dict[str, str] | None = None) -> None:
        detail = "".join(f"\n  {k}: {v}" for k, v in (fields or {}).items())
        super().__init__(f"{status} {code}: {message}{detail}")
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields or {}


class ApiUnreachable(ConnectionError):
    """No connection to the API could be made (after the client's retries): nothing listens at the
    URL, or the host is unknown. Said in the user's terms, not aiohttp's."""

    def __init__(self, api_url: str, reason: str) -> None:
        super().__init__(f"cannot reach the API at {api_url} ({reason}) — is `minions up` running?")
        self.api_url = api_url
        self.reason = reason


class WaitInterrupted(KeyboardInterrupt):
    """Ctrl-C (a notebook's "interrupt the kernel") while waiting for a task: the waiting stopped, the
    task did not. A KeyboardInterrupt still, so whatever catches those catches this; its message, the
    last line a notebook shows, says how to wait again or cancel."""

    def __init__(self, task: str) -> None:
        super().__init__(f"stopped waiting for {task}; the task keeps running. Wait again: "
                         f"client.wait({task!r}); cancel it: client.cancel({task!r})")
        self.task = task


class MinionsClient:
    def __init__(self, api_url: str, token: str, *, timeout_s: float = 60.0, retries: int = 8,
                 on_unreachable: Callable[[ApiUnreachable, float], None] | None = None) -> None:
        self.api_url = api_url.rstrip("/")
        self.retries = retries
        # Told (the error, the wait before the next try) of each connection that could not be made
        # and will be tried again: a program can say why it waits (the CLI does, once).
        self.on_unreachable = on_unreachable
        self._headers = {"Authorization": f"Bearer {token}"}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._backoff = Backoff(first_s=0.5, max_s=10.0)

    @classmethod
    def from_env(cls, data_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> MinionsClient:
        """Connect as the CLI does: MINIONS_API_URL / MINIONS_TOKEN, else the up.json of a local
        `minions up` (found the way the CLI finds it)."""
        api_url, token = connection_settings(data_dir)
        return cls(api_url, token, **kwargs)

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

    # Plumbing ----------------------------------------------------------------------------------
    async def _send(self, method: str, path: str, *, body: Body | bytes | None = None,
                    params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                    once: bool = False) -> aiohttp.ClientResponse:
        """The response (to read and release) of the first attempt the server did not ask to
        repeat: 503/429 wait for Retry-After; a connection never made waits for backoff. A `once`
        body (a caller's stream) cannot be sent twice: only a connection never made is retried."""
        attempt = 0
        while True:
            data = body() if callable(body) else body
            try:
                resp = await self.session.request(method, self.api_url + path, data=data, params=params,
                                                  headers=headers)
            except aiohttp.ClientConnectorError as exc:
                unreachable = ApiUnreachable(self.api_url, _connect_reason(exc))
                if attempt >= self.retries:
                    raise unreachable from exc
                delay = self._backoff.delay(attempt)
                if self.on_unreachable is not None:
                    self.on_unreachable(unreachable, delay)
            else:
                if resp.status not in (429, 503) or attempt >= self.retries or once:
                    return resp
                delay = retry_after_s(resp.headers) or self._backoff.delay(attempt)
                resp.release()
            attempt += 1
            await asyncio.sleep(delay)

    async def _request(self, method: str, path: str, *, json: Any = None, body: Body | bytes | None = None,
                       params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None,
                       once: bool = False) -> Any:
        hdrs = dict(headers or {})
        if json is not None:
            body = jsoncodec.dumps(json)
            hdrs["Content-Type"] = "application/json"
        resp = await self._send(method, path, body=body, params=params, headers=hdrs, once=once)
        async with resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise _error(resp.status, raw)
            return jsoncodec.loads(raw) if raw else None

    # Typed: for pipelines -------------------------------------------------------------------
    @overload
    async def submit(self, task: Mapping[str, Any]) -> dict[str, Any]: ...

    @overload
    async def submit(self, task: InputSource | TableSource, *, team: str, project: str, name: str, kind: str,
                     model: str | None = None, params: Mapping[str, Any] | None = None, priority: int = 0,
                     subtask_size: int | None = None, id_column: str = "id",
                     text_column: str | None = None, replace: bool = False, placement: str = "any") -> Task: ...

    async def submit(self, task: Any, *, team: str | None = None, project: str | None = None,
                     name: str | None = None, kind: str | None = None, model: str | None = None,
                     params: Mapping[str, Any] | None = None, priority: int = 0,
                     subtask_size: int | None = None, id_column: str = "id",
                     text_column: str | None = None, replace: bool = False, placement: str = "any") -> Any:
        """`submit(records, team=, project=, name=, kind=, model=…)`: upload the records (a path to
        JSONL or Parquet, JSONL bytes, an iterable of dicts, a pandas DataFrame, a pyarrow Table or a
        Hugging Face Dataset) and submit a task reading them; the `Task`. Every record is checked
        first (InputError naming its line or row; nothing is uploaded then). A table's ids come from
        `id_column` (default `id`, else the row number) and its texts from `text_column` (default
        the kind's field: `text`, `prompt`, `messages` or `ms`): minions.sdk.tables. With `replace`,
        a task of this name goes first, once the records are uploaded and the server has judged the
        new body acceptable (`discard`; a refused body leaves the old task as it was). `placement`
        "trusted": only executors an admin vouched for lease its subtasks (no volunteer sees its input).
        `submit(body)`: POST a task body as docs/API.md writes it; the wire JSON."""
        if team is None:
            if not isinstance(task, Mapping):
                raise TypeError("submit(records, ...) needs team=, project=, name= and kind=")
            result: dict[str, Any] = await self._request("POST", "/api/v1/tasks", json=dict(task))
            return result
        if project is None or name is None or kind is None:
            raise TypeError("submit(records, ...) needs team=, project=, name= and kind=")
        if isinstance(task, Mapping):
            raise TypeError("records must be a path, JSONL bytes or an iterable of dicts, not one dict")
        if is_table(task):  # checked row by row as it is read
            uri = await self._upload(table_records(task, kind, id_column=id_column, text_column=text_column))
        else:
            uri = await self._upload(task, kind)
        body: dict[str, Any] = {"team": team, "project": project, "name": name, "kind": kind,
                                "input": {"uri": uri}, "priority": priority, "params": dict(params or {})}
        if model is not None:
            body["model"] = model
        if subtask_size is not None:
            body["subtask_size"] = subtask_size
        if placement != "any":
            body["placement"] = placement
        if replace:
            # Judged first, whole (fields, scope, priority cap): a body the server would refuse
            # must not cost the task it was to replace.
            await self.judge(body)
            await self.discard(team, project, name)
        return Task.from_json(await self._request("POST", "/api/v1/tasks", json=body))

    async def judge(self, body: Mapping[str, Any]) -> None:
        """Every check the server makes of a task body before it creates anything (`?dry_run=true`):
        raises the MinionsError a submission of it would (403, 422), creates nothing."""
        await self._request("POST", "/api/v1/tasks", json=dict(body), params={"dry_run": "true"})

    async def _upload(self, source: InputSource, kind: str | None = None) -> str:
        body, cleanup = await jsonl_body(source, kind)
        try:
            result = await self._request("POST", "/api/v1/inputs", body=body,
                                         headers={"Content-Type": "application/x-ndjson"})
        finally:
            await asyncio.to_thread(cleanup)
        uri: str = result["uri"]
        return uri

    async def get_task(self, ref: TaskRef) -> Task:
        return Task.from_json(await self.task(*task_parts(ref)))

    async def wait(self, ref: TaskRef, *, progress: bool = False, interval_s: float = 0.5,
                   timeout_s: float | None = None) -> Task:
        """The task once it has ended (completed, failed or cancelled), polling every `interval_s`;
        with `progress`, a progress bar on stderr meanwhile. TimeoutError after `timeout_s`."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        team, project, name = task_parts(ref)
        bar = ProgressBar(f"{team}/{project}/{name}") if progress else None
        try:
            while True:
                raw = await self.task(team, project, name)
                if bar is not None:
                    bar.update(raw)
                task = Task.from_json(raw)
                if task.finished:
                    return task
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"task {task.ref} is still {task.status} after {timeout_s} s")
                await asyncio.sleep(interval_s)
        finally:  # ended, timed out or cancelled: the bar's live display stops with the wait
            if bar is not None:
                bar.finish()

    async def iter_results(self, ref: TaskRef, *, partial: bool = False) -> AsyncGenerator[Result, None]:
        """One typed result per input record, in input order (a `FailedRecord` for a record that
        produced none); streamed, in constant memory whatever the task's size."""
        buffer = b""
        async for chunk in self.results(*task_parts(ref), partial=partial):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield result_from_json(_parsed(line))
        if buffer.strip():
            yield result_from_json(_parsed(buffer))

    # Raw: the wire JSON, as docs/API.md defines it ----------------------------------------------
    async def task(self, team: str, project: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", f"/api/v1/tasks/{team}/{project}/{name}")
        return result

    async def tasks(self, *, team: str | None = None, project: str | None = None, status: str | None = None,
                    limit: int = 50, cursor: str | None = None, interactive: str | None = None) -> dict[str, Any]:
        """A page of tasks, newest first. `interactive`: the OpenAI interactive lane's requests, left
        out by default ("false"), "true" for only them, "all" for both."""
        params = {k: v for k, v in (("team", team), ("project", project), ("status", status),
                                    ("cursor", cursor), ("limit", str(limit)), ("interactive", interactive))
                  if v is not None}
        result: dict[str, Any] = await self._request("GET", "/api/v1/tasks", params=params)
        return result

    async def cancel(self, team: str, project: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("POST", f"/api/v1/tasks/{team}/{project}/{name}/cancel")
        return result

    async def retry(self, team: str, project: str, name: str) -> dict[str, Any]:
        """Run a failed task's failed subtasks again (its committed results stay); the task, running again.
        MinionsError 409 `task_not_failed` for a task that is not failed."""
        result: dict[str, Any] = await self._request("POST", f"/api/v1/tasks/{team}/{project}/{name}/retry")
        return result

    async def verify(self, team: str, project: str, name: str, *, every: bool = False,
                     verify_name: str | None = None) -> dict[str, Any]:
        """Run a finished task's results again as a task of their own (`{"task", "subtasks"}`; task
        None when nothing is to be verified): those from executors quarantined since, or all."""
        body: dict[str, Any] = {"all": every, **({"name": verify_name} if verify_name else {})}
        # once: a retried POST would make a second verification task
        result: dict[str, Any] = await self._request("POST", f"/api/v1/tasks/{team}/{project}/{name}/verify",
                                                     json=body, once=True)
        return result

    async def delete(self, team: str, project: str, name: str) -> None:
        """Delete a finished task; its input and results are then garbage-collected."""
        await self._request("DELETE", f"/api/v1/tasks/{team}/{project}/{name}")

    async def discard(self, team: str, project: str, name: str) -> dict[str, Any] | None:
        """Make way for a new task of this name: the task is cancelled if it has not ended, then
        deleted with its subtasks, so none of its results can be read again (a successor has another
        id, and every output key carries it). The task as it was before, or None if there was none."""
        try:
            task = await self.task(team, project, name)
        except MinionsError as exc:
            if exc.status == 404:
                return None
            raise
        if task["status"] not in FINISHED_TASK_STATUSES:
            await self.cancel(team, project, name)
        await self.delete(team, project, name)
        return task

    @overload
    def results(self, task: TaskRef, /, *, partial: bool = False) -> Results: ...

    @overload
    def results(self, team: str, project: str, name: str, /, *, partial: bool = False,
                progress: Progress | None = None) -> AsyncIterator[bytes]: ...

    def results(self, *task: Any, partial: bool = False, progress: Progress | None = None) -> Any:
        """`results(task)` (a Task or "team/project/name"): a `Results` (minions.sdk.results), which
        iterates the typed records and gives `to_numpy()`, `to_arrow()`, `to_pandas()`, `write(path)`.
        `results(team, project, name)`: the raw JSONL, chunk by chunk (`_result_chunks`)."""
        if len(task) == 1:
            return Results(self, task[0], partial=partial)
        team, project, name = task
        return self._result_chunks(team, project, name, partial=partial, progress=progress)

    async def _result_chunks(self, team: str, project: str, name: str, *, partial: bool = False,
                             progress: Progress | None = None) -> AsyncIterator[bytes]:
        """The results, chunk by chunk (JSONL). A compacted task's come as its parts, fetched straight
        from the object store and each verified (minions.sdk.parts; `progress(bytes, total)` follows
        them); otherwise, or for `partial`, the API's stream."""
        if not partial:
            listing = await self.result_parts(team, project, name)
            if listing is not None and listing["compacted"]:
                async for chunk in fetch_parts(listing, self._timeout, progress):
                    yield chunk
                return
        params = {"partial": "true"} if partial else None
        resp = await self._send("GET", f"/api/v1/tasks/{team}/{project}/{name}/results", params=params)
        async with resp:
            if resp.status >= 400:
                raise _error(resp.status, await resp.read())
            async for chunk in resp.content.iter_chunked(1 << 16):
                yield chunk

    async def result_parts(self, team: str, project: str, name: str) -> dict[str, Any] | None:
        """The `?format=parts` listing of a finished task; None from a server that predates it."""
        try:
            listing: dict[str, Any] = await self._request(
                "GET", f"/api/v1/tasks/{team}/{project}/{name}/results", params={"format": "parts"})
        except MinionsError as exc:
            if exc.status == 400 and "format" in exc.fields:
                return None
            raise
        return listing

    async def upload_input(self, chunks: AsyncIterator[bytes] | bytes, *, sha256: str | None = None) -> str:
        """Upload JSONL; with `sha256` (of the whole body) it is stored under that hash, so the same
        bytes give the same URI (and the server skips an upload its team already has)."""
        headers = {"Content-Type": "application/x-ndjson"}
        params = {"sha256": sha256} if sha256 else None
        if isinstance(chunks, bytes):
            result = await self._request("POST", "/api/v1/inputs", body=chunks, params=params, headers=headers)
        else:
            stream = chunks
            result = await self._request("POST", "/api/v1/inputs", body=lambda: stream, params=params,
                                         headers=headers, once=True)
        uri: str = result["uri"]
        return uri

    # Executors and health ----------------------------------------------------------------------
    async def executors(self, team: str | None = None) -> list[dict[str, Any]]:
        params = {"team": team} if team else None
        result = await self._request("GET", "/api/v1/executors", params=params)
        executors: list[dict[str, Any]] = result["executors"]
        return executors

    async def usage(self, *, since: str | None = None, team: str | None = None,
                    by: str | None = None) -> dict[str, Any]:
        """Compute-seconds and records of the attempts that ended in the window (`since`, e.g. "7d"),
        per team, executor or owner (`by`): GET /api/v1/usage (docs/API.md)."""
        params = {k: v for k, v in (("since", since), ("team", team), ("by", by)) if v}
        result: dict[str, Any] = await self._request("GET", "/api/v1/usage", params=params or None)
        return result

    async def release_executor(self, executor_id: str) -> dict[str, Any]:
        """Lift an executor's quarantine (admin): it claims again, its results checked until it earns trust."""
        result: dict[str, Any] = await self._request("POST", f"/api/v1/executors/{executor_id}/release")
        return result

    async def team_shares(self) -> list[dict[str, Any]]:
        """Each known team's share of the pool: `weight`, `priority_cap`, `max_leases` (a team's user
        sees its own team only)."""
        result: dict[str, Any] = await self._request("GET", "/api/v1/teams")
        teams: list[dict[str, Any]] = result["teams"]
        return teams

    async def set_team_share(self, team: str, *, weight: float | None = None, priority_cap: int | None = None,
                             max_leases: int | None = None) -> dict[str, Any]:
        """Set a team's weight, priority cap or lease cap (0: no cap) (admin); what is not given is kept."""
        body = {key: value for key, value in (("weight", weight), ("priority_cap", priority_cap),
                                              ("max_leases", max_leases)) if value is not None}
        result: dict[str, Any] = await self._request("PATCH", f"/api/v1/teams/{quote(team, safe='')}", json=body)
        return result

    async def health(self) -> dict[str, Any]:
        result: dict[str, Any] = await self._request("GET", "/api/v1/health")
        return result


def client_settings(data_dir: Path | None, api_url: str | None = None,
                    token: str | None = None) -> config.ClientSettings:
    """Where a client connects, the one lookup of SDK and CLI: the flag, else the environment
    (config.ClientSettings), else the up.json of a local `minions up`, else the default URL; the
    token may come back empty (the caller says how to give one)."""
    env = config.client_from_env()
    up = read_up_json(data_dir)
    return config.ClientSettings(api_url=api_url or env.api_url or up.get("api_url") or DEFAULT_API_URL,
                                 token=token or env.token or up.get("admin_token") or "")


def connection_settings(data_dir: str | os.PathLike[str] | None = None) -> tuple[str, str]:
    """(API URL, token) from MINIONS_API_URL / MINIONS_TOKEN, else the up.json of a local `minions up`
    (the lookup the CLI makes too, so SDK and CLI always agree)."""
    settings = client_settings(Path(data_dir) if data_dir is not None else None)
    if not settings.token:
        raise MinionsError(0, "no_token", "no token: set MINIONS_TOKEN, or start `minions up` on this machine")
    return settings.api_url, settings.token


def _error(status: int, raw: bytes) -> MinionsError:
    try:
        error = jsoncodec.loads(raw)["error"]
        return MinionsError(status, error.get("code", "error"), error.get("message", ""), error.get("fields"))
    except (ValueError, KeyError, TypeError):
        return MinionsError(status, "http_error", raw.decode(errors="replace")[:500])


def _parsed(line: bytes) -> Any:
    """A results line's JSON; UnknownResult (the SDK's error for an unreadable line) if it is none."""
    try:
        return jsoncodec.loads(line)
    except jsoncodec.JSONDecodeError as exc:
        raise UnknownResult(f"a results line is not JSON ({exc}): {line[:200]!r}") from None


def _connect_reason(exc: aiohttp.ClientConnectorError) -> str:
    """What went wrong in a few words ("Connection refused"), without aiohttp's restatement of
    the host, port and SSL settings."""
    error = exc.os_error
    if error.errno is not None and error.errno > 0:
        return os.strerror(error.errno)  # asyncio's own text repeats the address
    return error.strerror or type(error).__name__
