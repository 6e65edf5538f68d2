"""The API's one door to the database: every statement of `sql/queries/api.sql` and
`sql/queries/web.sql`, wrapped once with keyword arguments and a typed result (the base is
minions/db/gateway.py). Handlers and use cases call these methods; none sees SQL or `$n`.

The parameter order of each statement is written here and nowhere else; the SQL functions behind
them (`sql/schema/`) hold the rules, so a method is a translation, never a decision."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any, TypedDict

from minions.db.gateway import Gateway, Row
from minions.db.queries import Queries
from minions.protocol import LeaseState

# The columns of a task as the API shows it: the tasks row, its live counts and warnings (api.sql).
TaskRow = Row
# A token as minion_tokens lists it (never its hash).
TokenRow = Row
# One lease a claim handed out (minion_claim_batch's columns, with input_data), or a refusal's
# one row whose verdict says why.
ClaimRow = Row
# A live lease (minion_lease_info's columns; with input_data when read for a complete).
LeaseRow = Row
# One subtask of a task's results page (api.sql result_subtasks).
ResultSubtaskRow = Row
# A held result of a spot check: its round, result key, SHA-256, size and kept bytes.
HeldResultRow = Row
# An executor as GET /api/v1/executors shows it.
ExecutorListRow = Row
# One row of minion_usage.
UsageRow = Row
# One row of a team's share in force.
TeamShareRow = Row
# One subtask of the web UI's subtasks page, with its attempts.
SubtaskViewRow = Row


class TokenPrincipalRow(TypedDict):
    id: int
    role: str
    team: str | None
    expires_in_s: float | None


class RequestHashRow(TypedDict):
    id: int
    request_hash: str


class ExecutorOwnerRow(TypedDict):
    id: uuid.UUID
    token_id: int | None
    team: str | None
    capabilities: list[str]
    status: str


class RegistrationRow(TypedDict):
    verdict: str
    executor_id: uuid.UUID | None
    retry_after_s: int | None


class VerdictRow(TypedDict):
    lease_token: uuid.UUID
    verdict: str


class HeartbeatRow(TypedDict):
    verdict: str
    lease_token: uuid.UUID | None
    state: LeaseState  # None on the first row, the verdict's


class LeaseInputRow(TypedDict):
    lease_token: uuid.UUID
    input_uri: str | None
    byte_start: int
    byte_end: int


class ResultPartRow(TypedDict):
    part: int
    first_subtask: int
    last_subtask: int
    key: str
    sha256: bytes
    bytes: int
    records: int


class VerifyMadeRow(TypedDict):
    task_id: int | None
    subtasks: int


# The verified copy of an output a complete commits: result key, SHA-256, size, the bytes when kept
# in the row, and the length of its vectors (an embedding output).
ResultCopy = tuple[str | None, bytes | None, int | None, bytes | None, int | None]


class SplitArrays(TypedDict):
    """The subtasks of a small task split at submission (parallel arrays), or all None."""

    starts: list[int] | None
    ends: list[int] | None
    first_records: list[int] | None
    records: list[int] | None


class ApiGateway(Gateway):
    queries = Queries("api")
    web_queries = Queries("web")

    # ---- health and settings

    async def ping(self, *, timeout: float) -> None:
        await self.db.fetchval(self.queries.ping, timeout=timeout)

    async def store_signing_key(self) -> str:
        value: str = await self.db.fetchval(self.queries.store_signing_key)
        return value

    # ---- tokens

    async def principal_by_token_hash(self, *, token_hash: bytes) -> TokenPrincipalRow | None:
        """The live token with this hash: id, role, team, and how long an answer may be cached."""
        row: TokenPrincipalRow | None = await self.db.fetchrow(self.queries.token_by_hash, token_hash)
        return row

    async def list_tokens(self, *, status: str | None) -> list[TokenRow]:
        return await self.db.fetch(self.queries.list_tokens, status)

    async def token_by_id(self, *, token_id: int) -> TokenRow | None:
        row: TokenRow | None = await self.db.fetchrow(self.queries.token_by_id, token_id)
        return row

    async def create_token(self, *, token_hash: bytes, prefix: str | None, role: str, team: str | None,
                           label: str | None, expires_in_s: float | None, owner: str | None, trusted: bool) -> int:
        token_id: int = await self.db.fetchval(self.queries.create_token, token_hash, prefix, role, team, label,
                                               expires_in_s, owner, trusted)
        return token_id

    async def revoke_token(self, *, token_id: int) -> dt.datetime | None:
        """When the token was revoked (now, or earlier); None when there is no such token."""
        revoked_at: dt.datetime | None = await self.db.fetchval(self.queries.revoke_token, token_id)
        return revoked_at

    # ---- tasks

    async def submit_task(self, *, team: str, project: str, name: str, kind: str, model: str,
                          params: dict[str, Any], priority: int, subtask_size: int, input_uri: str | None,
                          request_hash: str, token_id: int | None, split: SplitArrays,
                          kept_records: bytes | None, input_quota: int, capped: bool,
                          placement: str) -> TaskRow | None:
        """The new task as `task_by_id` shows it, or None when the name is taken. A priority above the
        team's cap for a `capped` submitter raises priority_above_cap; a kept input past the quota,
        ConfigurationLimitExceededError: either way nothing is submitted."""
        row: TaskRow | None = await self.db.fetchrow(
            self.queries.submit_task, team, project, name, kind, model, params, priority, subtask_size, None,
            input_uri, request_hash, token_id, split["starts"], split["ends"], split["first_records"],
            split["records"], kept_records, input_quota, capped, placement)
        return row

    async def priority_within_cap(self, *, team: str, priority: int, capped: bool) -> int:
        """`priority` when a submitter may give it to a task of `team`; else raises priority_above_cap."""
        value: int = await self.db.fetchval(self.queries.priority_within_cap, team, priority, capped)
        return value

    async def task_request_hash(self, *, team: str, project: str, name: str) -> RequestHashRow | None:
        row: RequestHashRow | None = await self.db.fetchrow(self.queries.task_request_hash, team, project, name)
        return row

    async def task_by_name(self, *, team: str, project: str, name: str) -> TaskRow | None:
        row: TaskRow | None = await self.db.fetchrow(self.queries.task_by_name, team, project, name)
        return row

    async def task_by_id(self, *, task_id: int) -> TaskRow | None:
        row: TaskRow | None = await self.db.fetchrow(self.queries.task_by_id, task_id)
        return row

    async def list_tasks(self, *, team: str | None, project: str | None, status: str | None, before_id: int | None,
                         limit: int, interactive: str) -> list[TaskRow]:
        """Newest first, ids below `before_id`; `interactive` 'true', 'false' or 'all': the /v1 lane's
        requests only, none of them, or both."""
        return await self.db.fetch(self.queries.list_tasks, team, project, status, before_id, limit, interactive)

    async def cancel_task(self, *, task_id: int) -> bool:
        """Whether this call cancelled it (false: it had ended)."""
        return bool(await self.db.fetchval(self.queries.cancel_task, task_id))

    async def retry_task(self, *, task_id: int) -> tuple[str, int]:
        """(verdict, subtasks queued again): 'retried', 'missing', 'not_failed' or 'nothing_to_retry'."""
        verdict, subtasks = await self.db.fetchrow(self.queries.retry_task, task_id)
        return str(verdict), int(subtasks or 0)

    async def verify_task(self, *, task_id: int, name: str, every: bool, token_id: int | None) -> VerifyMadeRow:
        """A verification task of finished task `task_id`: task_id None when there is nothing to verify
        (subtasks 0) or the name is taken (subtasks -1)."""
        row: VerifyMadeRow = await self.db.fetchrow(self.queries.verify_task, task_id, name, every, token_id)
        return row

    async def delete_task(self, *, task_id: int) -> str:
        """'deleted', 'not_finished' or 'missing'."""
        return str(await self.db.fetchval(self.queries.delete_task, task_id))

    async def task_dimension(self, *, task_id: int) -> int | None:
        """The length every vector of the task has; None before its first committed one."""
        value: int | None = await self.db.fetchval(self.queries.task_dimension, task_id)
        return value

    # ---- inputs

    async def record_input(self, *, uri: str, team: str | None, size: int, token_id: int | None, quota: int) -> str:
        """'ok', or why the upload is not recorded (the team's quota)."""
        return str(await self.db.fetchval(self.queries.record_input, uri, team, size, token_id, quota))

    async def team_input_bytes(self, *, team: str | None) -> int:
        return int(await self.db.fetchval(self.queries.team_input_bytes, team))

    async def input_use(self, *, team: str, uri: str, unscoped: bool, admin: bool) -> str:
        """'ok' when a task of `team`, submitted by such a caller, may read `uri`."""
        return str(await self.db.fetchval(self.queries.input_use, team, uri, unscoped, admin))

    async def kept_input(self, *, task_id: int, start: int, end: int) -> bytes | None:
        """Bytes [start, end) of a task's kept input; None when its input is an object (or it went)."""
        data: bytes | None = await self.db.fetchval(self.queries.kept_input, task_id, start, end)
        return data

    # ---- results

    async def result_subtasks(self, *, task_id: int, after: int, limit: int) -> list[ResultSubtaskRow]:
        """One page of a task's subtasks in input order, after subtask `after`."""
        return await self.db.fetch(self.queries.result_subtasks, task_id, after, limit)

    async def result_parts(self, *, task_id: int) -> list[ResultPartRow]:
        """A compacted task's result parts in order; none while it is not (fully) compacted."""
        return await self.db.fetch(self.queries.result_parts, task_id)

    async def task_subtasks(self, *, task_id: int, after: int, limit: int) -> list[SubtaskViewRow]:
        """The web UI's page of subtasks, with their holders and attempts."""
        return await self.db.fetch(self.web_queries.task_subtasks, task_id, after, limit)

    # ---- executors

    async def register_executor(self, *, token_id: int | None, team: str | None, name: str | None,
                                hardware: dict[str, Any], kinds: list[str], models: list[str],
                                preferences: list[dict[str, str | None]], max_per_token: int,
                                per_minute: int) -> RegistrationRow:
        row: RegistrationRow = await self.db.fetchrow(
            self.queries.register_executor, token_id, team, name, hardware, kinds, models, preferences,
            max_per_token, per_minute)
        return row

    async def set_executor_fingerprints(self, *, executor_id: uuid.UUID, fingerprints: list[dict[str, Any]]) -> None:
        await self.db.execute(self.queries.set_executor_fingerprints, executor_id, fingerprints)

    async def executor_owner(self, *, executor_id: uuid.UUID) -> ExecutorOwnerRow | None:
        row: ExecutorOwnerRow | None = await self.db.fetchrow(self.queries.executor_for_token, executor_id)
        return row

    async def deregister(self, *, executor_id: uuid.UUID) -> int:
        """How many leases going offline released."""
        return int(await self.db.fetchval(self.queries.deregister, executor_id) or 0)

    async def list_executors(self, *, team: str | None, viewer_team: str | None) -> list[ExecutorListRow]:
        """Executors of `team` (None: all) as a viewer scoped to `viewer_team` (None: sees all) may see them."""
        return await self.db.fetch(self.queries.list_executors, team, viewer_team)

    async def quarantine_reason(self, *, executor_id: uuid.UUID) -> str | None:
        reason: str | None = await self.db.fetchval(self.queries.quarantine_reason, executor_id)
        return reason

    async def release_quarantine(self, *, executor_id: uuid.UUID) -> bool:
        """Whether the executor was quarantined (and now is not)."""
        return bool(await self.db.fetchval(self.queries.release_quarantine, executor_id))

    # ---- leases

    async def claim_batch(self, *, executor_id: uuid.UUID, token_id: int | None, most: int,
                          straggler_factor: float) -> list[ClaimRow]:
        """Up to `most` leases (verdict 'leased'), or one row whose verdict says why none."""
        return await self.db.fetch(self.queries.claim_batch, executor_id, token_id, most, straggler_factor)

    async def heartbeat(self, *, executor_id: uuid.UUID, token_id: int | None,
                        lease_tokens: Sequence[uuid.UUID]) -> list[HeartbeatRow]:
        """The verdict first, then each named lease's state."""
        return await self.db.fetch(self.queries.heartbeat_as, executor_id, token_id, lease_tokens)

    async def lease_info(self, *, lease_token: uuid.UUID, with_kept_input: bool = False) -> LeaseRow | None:
        """A live lease; with `with_kept_input`, the range of a kept input too (a complete's check)."""
        query = self.queries.lease_to_complete if with_kept_input else self.queries.lease_info
        row: LeaseRow | None = await self.db.fetchrow(query, lease_token)
        return row

    async def lease_inputs(self, *, lease_tokens: Sequence[uuid.UUID]) -> list[LeaseInputRow]:
        """The input object and range of each live lease among these tokens."""
        return await self.db.fetch(self.queries.lease_inputs, lease_tokens)

    async def output_writable(self, *, key: str) -> bool:
        return bool(await self.db.fetchval(self.queries.output_writable, key))

    async def input_readable(self, *, lease_token: uuid.UUID, start: int, end: int) -> bool:
        return bool(await self.db.fetchval(self.queries.input_readable, lease_token, start, end))

    async def complete(self, *, lease_token: uuid.UUID, records: int, seconds: float | None,
                       copy: ResultCopy) -> str:
        return str(await self.db.fetchval(self.queries.complete, lease_token, records, seconds, *copy))

    async def complete_batch(self, *, lease_tokens: Sequence[uuid.UUID], records: Sequence[int],
                             seconds: Sequence[float | None], copies: Sequence[ResultCopy]) -> list[VerdictRow]:
        """One verdict per lease, in the order given."""
        return await self.db.fetch(
            self.queries.complete_batch, lease_tokens, records, seconds, [c[0] for c in copies],
            [c[1] for c in copies], [c[2] for c in copies], [c[3] for c in copies], [c[4] for c in copies])

    async def fail(self, *, lease_token: uuid.UUID, error: str, retryable: bool) -> str:
        return str(await self.db.fetchval(self.queries.fail, lease_token, error, retryable))

    async def fail_batch(self, *, lease_tokens: Sequence[uuid.UUID], errors: Sequence[str],
                         retryable: Sequence[bool]) -> list[VerdictRow]:
        return await self.db.fetch(self.queries.fail_batch, lease_tokens, errors, retryable)

    async def release(self, *, lease_token: uuid.UUID) -> str:
        return str(await self.db.fetchval(self.queries.release, lease_token))

    async def release_batch(self, *, lease_tokens: Sequence[uuid.UUID]) -> list[VerdictRow]:
        return await self.db.fetch(self.queries.release_batch, lease_tokens)

    # ---- spot checks

    async def check_candidates(self, *, lease_token: uuid.UUID) -> list[HeldResultRow]:
        """The results held for the check of the subtask this replica lease runs, by round."""
        return await self.db.fetch(self.queries.check_candidates, lease_token)

    async def replica_checks(self, *, lease_tokens: Sequence[uuid.UUID]) -> list[HeldResultRow]:
        """The held results each of these leases checks (with its lease_token), in round order."""
        return await self.db.fetch(self.queries.replica_checks, lease_tokens)

    async def check_vote(self, *, lease_token: uuid.UUID, records: int, seconds: float | None, copy: ResultCopy,
                         agrees_with: int | None) -> str:
        """A replica's vote: 'agreed', 'settled', 'disputed', 'no_quorum', or why it counts for nothing."""
        return str(await self.db.fetchval(self.queries.check_vote, lease_token, records, seconds, *copy,
                                          agrees_with))

    async def settle_quarantines(self) -> int:
        """Subtasks run again for the quarantines votes flagged."""
        return int(await self.db.fetchval(self.queries.settle_quarantines) or 0)

    # ---- teams and usage

    async def team_shares(self, *, team: str | None) -> list[TeamShareRow]:
        return await self.db.fetch(self.queries.team_shares, team)

    async def set_team_share(self, *, team: str, weight: float | None, priority_cap: int | None,
                             max_leases: int | None) -> TeamShareRow | None:
        """The share after the change (None keeps a value); None when nothing names the team."""
        row: TeamShareRow | None = await self.db.fetchrow(self.queries.set_team_share, team, weight, priority_cap,
                                                          max_leases)
        return row

    async def usage(self, *, since: dt.datetime, team: str | None, by: str) -> list[UsageRow]:
        return await self.db.fetch(self.queries.usage, since, team, by)

