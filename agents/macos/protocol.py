"""The executor protocol's messages (API.md, "Executor protocol"), parsed into typed values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ProtocolError(ValueError):
    """The server answered with a body that does not have the documented shape."""


@dataclass(frozen=True)
class Registration:
    executor_id: str
    heartbeat_interval_s: float
    lease_timeout_s: float
    long_poll_s: float


@dataclass(frozen=True)
class InputRef:
    url: str
    start: int
    end: int  # exclusive: the range is [start, end)
    records: int


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
        return Registration(
            executor_id=str(body["executor_id"]),
            heartbeat_interval_s=float(body["heartbeat_interval_s"]),
            lease_timeout_s=float(body["lease_timeout_s"]),
            long_poll_s=float(body["long_poll_s"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad registration answer: {exc!r}") from exc


def parse_claim(body: Any) -> Claim:
    try:
        lease, sub = body["lease"], body["subtask"]
        start, end = sub["input"]["range"]
        params = sub.get("params") or {}
        if not isinstance(params, dict):
            raise TypeError("params must be an object")
        subtask = Subtask(
            team=str(sub["team"]),
            project=str(sub["project"]),
            task_name=str(sub["task_name"]),
            subtask_id=int(sub["subtask_id"]),
            attempt=int(sub["attempt"]),
            kind=str(sub["kind"]),
            model=None if sub.get("model") is None else str(sub["model"]),
            params=params,
            input=InputRef(
                url=str(sub["input"]["url"]),
                start=int(start),
                end=int(end),
                records=int(sub["input"]["records"]),
            ),
            output_url=str(sub["output"]["url"]),
        )
        return Claim(token=str(lease["token"]), expires_at=str(lease.get("expires_at", "")), subtask=subtask)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"bad claim answer: {exc!r}") from exc
