"""The OpenAI adapter's one door to the database: each statement of `sql/queries/openai.sql` it runs,
as a method with keyword arguments and a typed result (minions/db/gateway.py). Handlers build one
per request from the app's pool with `openai_gateway(request.app)`: it is a tiny object."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict

from aiohttp import web

from minions.db.gateway import Gateway, Row
from minions.db.queries import Queries


class FileRow(TypedDict):
    """A live file of `openai_files`, as /v1/files shows it."""

    id: str
    team: str | None  # None: uploaded with an unscoped token
    purpose: str
    filename: str
    bytes: int
    uri: str
    created_at: datetime


class ModelRow(TypedDict):
    """A model the pool knows: the kinds it is known for, when first advertised, whether served now."""

    model: str
    kinds: list[str]
    advertised_at: datetime
    online: bool


class ModelAvailability(TypedDict):
    """Whether a kind's model was ever advertised, and whether an executor online now serves it."""

    known: bool
    online: bool


class SubmittedRequest(TypedDict):
    """An interactive request's task, and what its subtask is claimed as (to wake waiting claims)."""

    task_id: int
    capability: str


class OpenAIGateway(Gateway):
    queries = Queries("openai")

    # Files.

    async def add_file(self, *, file_id: str, team: str | None, purpose: str, filename: str, size: int,
                       uri: str, created_by: int | None) -> None:
        """Record a file no quota refuses (a batch's output or error file)."""
        await self.db.execute(self.queries.add_file, file_id, team, purpose, filename, size, uri, created_by)

    async def add_file_within_quota(self, *, file_id: str, team: str | None, purpose: str, filename: str,
                                    size: int, uri: str, created_by: int, quota: int) -> bool:
        """Record an upload within the team's input quota (0: none). False: over it, nothing recorded."""
        verdict = await self.db.fetchval(self.queries.add_file_within_quota, file_id, team, purpose, filename,
                                         size, uri, created_by, quota)
        return bool(verdict == "ok")

    async def file_by_id(self, *, file_id: str) -> FileRow | None:
        """A live (not deleted) file, of any team: the caller judges whether it may be seen."""
        row: FileRow | None = await self.db.fetchrow(self.queries.file_by_id, file_id)
        return row

    async def list_files(self, *, team: str | None, purpose: str | None, after: str | None,
                         limit: int) -> list[FileRow]:
        """Live files, newest first: of `team` (None: every team), of `purpose` (None: any), older
        than the file `after` (None: from the newest)."""
        rows: list[FileRow] = await self.db.fetch(self.queries.list_files, team, purpose, after, limit)
        return rows

    async def delete_file(self, *, file_id: str) -> str | None:
        """Mark a live file deleted (its bytes leave the team's quota): where the store holds it, or
        None when no live file has that id."""
        uri: str | None = await self.db.fetchval(self.queries.delete_file, file_id)
        return uri

    async def team_input_bytes(self, *, team: str | None) -> int:
        """The input bytes a team stores: what its quota is measured against."""
        return int(await self.db.fetchval(self.queries.team_input_bytes, team))

    # Models.

    async def model_known(self, *, kind: str, model: str) -> bool:
        """Whether an executor has ever advertised `kind` with `model`."""
        return bool(await self.db.fetchval(self.queries.model_known, kind, model))

    async def model_availability(self, *, kind: str, model: str) -> ModelAvailability:
        """Whether `kind` with `model` is known, and whether an executor online now serves it."""
        row: ModelAvailability = await self.db.fetchrow(self.queries.model_availability, kind, model)
        return row

    async def known_models(self, *, model: str | None) -> list[ModelRow]:
        """The models the pool knows, by name (`model`: that one only, as a list of zero or one)."""
        rows: list[ModelRow] = await self.db.fetch(self.queries.known_models, model)
        return rows

    # Batches.

    async def priority_within_cap(self, *, team: str, priority: int, capped: bool) -> int:
        """`priority`, when a submitter (`capped`: held to the team's cap) may give it to a task of
        `team`; else the statement raises priority_above_cap (or unknown_team)."""
        return int(await self.db.fetchval(self.queries.priority_within_cap, team, priority, capped))

    async def submit_batch(self, *, batch_id: str, team: str, project: str, kind: str, model: str,
                           params: dict[str, Any], subtask_size: int, max_attempts: int, input_uri: str,
                           endpoint: str, input_file_id: str, window: str, window_s: float,
                           metadata: dict[str, str] | None, request_total: int, record_total: int,
                           created_by: int, priority: int, capped: bool) -> None:
        """A batch that passed validation and its task, in one statement; above the team's cap
        (`capped`) it raises priority_above_cap and nothing is submitted."""
        await self.db.execute(self.queries.submit_batch, batch_id, team, project, kind, model, params,
                              subtask_size, max_attempts, input_uri, endpoint, input_file_id, window, window_s,
                              metadata, request_total, record_total, created_by, priority, capped)

    async def reject_batch(self, *, batch_id: str, team: str, endpoint: str, input_file_id: str, window: str,
                           window_s: float, metadata: dict[str, str] | None, errors: list[dict[str, Any]],
                           request_total: int, created_by: int) -> None:
        """A batch that failed validation: recorded failed, with its errors, and no task."""
        await self.db.execute(self.queries.reject_batch, batch_id, team, endpoint, input_file_id, window,
                              window_s, metadata, errors, request_total, created_by)

    async def batch_by_id(self, *, batch_id: str) -> Row | None:
        """A batch's whole row, with its task's status, end and records done."""
        row: Row | None = await self.db.fetchrow(self.queries.batch_by_id, batch_id)
        return row

    async def list_batches(self, *, team: str | None, after: str | None, limit: int) -> list[Row]:
        """Batches as `batch_by_id` reads them, newest first: of `team` (None: every team), older
        than the batch `after` (None: from the newest)."""
        rows: list[Row] = await self.db.fetch(self.queries.list_batches, team, after, limit)
        return rows

    async def end_batch(self, *, batch_id: str, ending: str) -> bool:
        """Cancel or expire (`ending`: "cancel" or "expire") a batch in progress: its task is
        cancelled. False when the batch has already ended or is ending."""
        return bool(await self.db.fetchval(self.queries.end_batch, batch_id, ending))

    async def begin_finalize(self, *, batch_id: str, stale_s: float) -> bool:
        """Take an ended batch's finalization (or retake one whose finalizer has been at it over
        `stale_s`): True when this caller is to write its files."""
        return bool(await self.db.fetchval(self.queries.begin_finalize, batch_id, stale_s))

    async def finish_batch(self, *, batch_id: str, output_file_id: str | None, error_file_id: str | None,
                           completed: int, failed: int) -> None:
        """The batch's files are written: it ends completed, cancelled or expired."""
        await self.db.execute(self.queries.finish_batch, batch_id, output_file_id, error_file_id, completed,
                              failed)

    # Tasks.

    async def task_row(self, *, task_id: int) -> Row | None:
        """A task's whole row, with its subtask counts and live records done (`records_done_live`)."""
        row: Row | None = await self.db.fetchrow(self.queries.task_row, task_id)
        return row

    async def submit_interactive(self, *, team: str, project: str, name: str, kind: str, model: str,
                                 params: dict[str, Any], max_attempts: int, input_uri: str, size: int,
                                 records: int, created_by: int) -> SubmittedRequest:
        """An interactive request as a one-subtask task above every native priority, split at once."""
        row: SubmittedRequest = await self.db.fetchrow(self.queries.submit_interactive, team, project, name, kind,
                                                       model, params, max_attempts, input_uri, size, records,
                                                       created_by)
        return row

    async def cancel_task(self, *, task_id: int) -> bool:
        """Cancel a task not yet ended. False when it had ended (or does not exist)."""
        return bool(await self.db.fetchval(self.queries.cancel_task, task_id))


# Set beside the API's gateway, on the same pool, when the application starts (app.py).
OPENAI_GATEWAY = web.AppKey("openai_gateway", OpenAIGateway)


def openai_gateway(app: web.Application) -> OpenAIGateway:
    """The gateway on the app's pool (made once, beside the API's: app.py): each call on a pooled
    connection, in its own transaction."""
    return app[OPENAI_GATEWAY]
