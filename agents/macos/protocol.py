"""The executor protocol's answers as the agent uses them, decoded through the protocol's one
definition of its messages (minions/protocol.py; API.md, "Executor protocol")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minions import protocol
from minions.protocol import ProtocolError

__all__ = ["Claim", "InputRef", "ProtocolError", "Registration", "Subtask", "parse_claim", "parse_claims",
           "parse_registration"]


@dataclass(frozen=True)
class Registration:
    executor_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    long_poll_s: float
    max_claim: int = 1  # servers before the batched protocol: one subtask per claim
    inline_output_bytes: int = 0  # ... and no inline outputs


@dataclass(frozen=True)
class InputRef:
    url: str
    start: int
    end: int  # exclusive: the range is [start, end)
    records: int
    data: bytes | None = None  # the range itself, when the server sent it inline


@dataclass(frozen=True)
class Subtask:
    team: str
    project: str
    task_name: str
    subtask_id: int
    attempt: int
    kind: str
    model: str | None
    params: dict[str, Any]
    input: InputRef
    output_url: str

    @property
    def label(self) -> str:
        return f"{self.team}/{self.project}/{self.task_name}#{self.subtask_id}.{self.attempt}"


@dataclass(frozen=True)
class Claim:
    token: str
    expires_at: str
    subtask: Subtask


def parse_registration(body: Any) -> Registration:
    try:
        reg = protocol.convert(body, protocol.Registered)
    except ProtocolError as exc:
        raise ProtocolError(f"bad registration answer: {exc}") from exc
    return Registration(executor_id=reg.executor_id, heartbeat_interval_s=reg.heartbeat_interval_s,
                        lease_timeout_s=reg.lease_timeout_s, long_poll_s=reg.long_poll_s,
                        max_claim=reg.max_claim, inline_output_bytes=reg.inline_output_bytes)


def parse_claim(body: Any) -> Claim:
    """The answer to a claim without `max` (one Lease)."""
    try:
        return _claim(protocol.convert(body, protocol.Lease))
    except ProtocolError as exc:
        raise ProtocolError(f"bad claim answer: {exc}") from exc


def parse_claims(body: Any) -> list[Claim]:
    """The answer to a claim with `max` (a LeaseBatch)."""
    try:
        return [_claim(lease) for lease in protocol.convert(body, protocol.LeaseBatch).leases]
    except ProtocolError as exc:
        raise ProtocolError(f"bad claim answer: {exc}") from exc


def _claim(lease: protocol.Lease) -> Claim:
    sub = lease.subtask
    data = None if sub.input.data is None else sub.input.data.encode()
    if data is not None and len(data) != sub.input.end - sub.input.start:
        raise ProtocolError(f"inline input of {len(data)} bytes for a range of {sub.input.end - sub.input.start}")
    subtask = Subtask(
        team=sub.team, project=sub.project, task_name=sub.task_name, subtask_id=sub.subtask_id,
        attempt=sub.attempt, kind=sub.kind, model=sub.model, params=sub.params,
        input=InputRef(url=sub.input.url, start=sub.input.start, end=sub.input.end, records=sub.input.records,
                       data=data),
        output_url=sub.output.url,
    )
    return Claim(token=lease.lease.token, expires_at=lease.lease.expires_at, subtask=subtask)
