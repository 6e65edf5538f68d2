"""Typed objects of the API (docs/API.md): a task, and one result record per input record.

Frozen dataclasses, not pydantic or msgspec: the SDK lands in pipelines' own environments, which pin
their own pydantic (v1 or v2) and rarely have msgspec; the stdlib adds no dependency to resolve, and
mypy checks them natively. Parsing is tolerant of fields a newer server adds (kept in `raw`), so an
older SDK keeps working against a newer API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from minions import result_shapes
from minions.kinds import FINISHED_TASK_STATUSES
from minions.records import format_id

RecordId = str | int


@dataclass(frozen=True, slots=True)
class SubtaskCounts:
    total: int = 0
    pending: int = 0
    leased: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True)
class Task:
    """A task as the API shows it; `ref` ("team/project/name") names it in every call."""

    team: str
    project: str
    name: str
    kind: str
    model: str
    status: str
    records_total: int
    records_done: int
    subtasks: SubtaskCounts
    params: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    placement: str = "any"  # "trusted": only executors an admin vouched for lease it
    subtask_size: int | None = None
    input_uri: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ref(self) -> str:
        return f"{self.team}/{self.project}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_TASK_STATUSES

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to end, once both are known."""
        if self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Task:
        records = value.get("records") or {}
        counts = value.get("subtasks") or {}
        return cls(
            team=value["team"], project=value["project"], name=value["name"], kind=value["kind"],
            model=value.get("model") or "", status=value["status"],
            records_total=int(records.get("total") or 0), records_done=int(records.get("done") or 0),
            subtasks=SubtaskCounts(**{k: int(counts.get(k) or 0) for k in SubtaskCounts.__dataclass_fields__}),
            params=value.get("params") or {}, priority=int(value.get("priority") or 0),
            placement=value.get("placement") or "any",
            subtask_size=value.get("subtask_size"), input_uri=value.get("input_uri"),
            created_at=_time(value.get("created_at")), started_at=_time(value.get("started_at")),
            finished_at=_time(value.get("finished_at")), error=value.get("error"), raw=value,
        )


TaskRef = Task | str  # a Task, or "team/project/name"


def task_parts(ref: TaskRef) -> tuple[str, str, str]:
    """(team, project, name) of a task, from the Task or its "team/project/name"."""
    if isinstance(ref, Task):
        return ref.team, ref.project, ref.name
    parts = ref.split("/")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"a task is named TEAM/PROJECT/NAME, not {ref!r}")
    return parts[0], parts[1], parts[2]


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    id: RecordId
    embedding: list[float]
    ok = True


@dataclass(frozen=True, slots=True)
class CompletionResult:
    id: RecordId
    text: str
    usage: dict[str, int] = field(default_factory=dict)
    ok = True


@dataclass(frozen=True, slots=True)
class SleepResult:
    id: RecordId
    slept_ms: float
    ok = True


@dataclass(frozen=True, slots=True)
class FailedRecord:
    """A record whose subtask failed for good, or was cancelled: `error` says why."""

    id: RecordId
    error: str
    ok = False


Result = EmbeddingResult | CompletionResult | SleepResult | FailedRecord


class UnknownResult(ValueError):
    """A result line this SDK cannot read (a newer server's kind, or not a result at all)."""


def result_from_json(value: Any) -> Result:
    """The typed object of one results line."""
    if not isinstance(value, dict) or "id" not in value:
        raise UnknownResult(f"not a result record: {str(value)[:200]}")
    if "error" in value:
        return FailedRecord(value["id"], str(value["error"]))
    kind = "embedding" if "embedding" in value else "completion" if "text" in value else None
    if kind is not None:
        try:  # the server checks shapes at complete; a result committed before may break them
            result_shapes.check_record(kind, value)
        except result_shapes.Malformed as exc:
            raise UnknownResult(f"record {format_id(value['id'])}: {exc}") from None
    if kind == "embedding":
        return EmbeddingResult(value["id"], value["embedding"])
    if kind == "completion":
        return CompletionResult(value["id"], value["text"], value.get("usage") or {})
    if "slept_ms" in value:
        return SleepResult(value["id"], value["slept_ms"])
    raise UnknownResult(f"a result of no kind this SDK knows: {str(value)[:200]}")


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None
