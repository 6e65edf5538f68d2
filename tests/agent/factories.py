"""Small builders for protocol values in tests."""

from __future__ import annotations

from typing import Any

from minions.agents.macos.protocol import InputRef, OutputRef, Subtask
from minions.protocol import CheckRef


def subtask(kind: str, model: str | None = None, params: dict[str, Any] | None = None, records: int = 1,
            check: list[str] | None = None) -> Subtask:
    return Subtask(
        team="search",
        project="ranker",
        task_name="t1",
        subtask_id=0,
        attempt=1,
        kind=kind,
        model=model,
        params=params or {},
        input=InputRef(url="http://store.invalid/in", range=[0, 1], records=records),
        output=OutputRef(url="http://store.invalid/out"),
        check=None if check is None else CheckRef(outputs=check),
    )
