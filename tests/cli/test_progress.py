"""The progress bar fits the terminal; off a terminal it writes a throttled plain line."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from minions.sdk.progress import ProgressBar

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _task(done: int, total: int = 300_000, status: str = "running") -> dict[str, Any]:
    return {"records": {"total": total, "done": done}, "status": status,
            "subtasks": {"total": 6, "done": 1, "leased": 2, "failed": 1, "pending": 2, "cancelled": 0}}


@pytest.mark.parametrize("columns", [40, 80, 200])
def test_the_bar_fits_the_terminal(columns: int) -> None:
    out = io.StringIO()
    console = Console(file=out, width=columns, force_terminal=True, color_system=None)
    bar = ProgressBar("search/ranker/a-task-name-longer-than-any-terminal-would-want-to-show", console=console)
    for done in (0, 15_000, 150_000, 300_000):
        bar.update(_task(done, status="completed" if done == 300_000 else "running"))
    bar.finish()
    # Each redraw rewrites the same line(s) in place; every visible line is within the width.
    lines = [ANSI.sub("", chunk) for chunk in re.split(r"[\r\n]", out.getvalue())]
    assert any("completed" in line for line in lines), lines
    too_wide = [line for line in lines if len(line) > columns]
    assert not too_wide, too_wide


def test_not_a_terminal_gives_throttled_plain_lines() -> None:
    out = io.StringIO()  # not a TTY
    bar = ProgressBar("search/ranker/emb-1", stream=out)
    for done in range(0, 3000, 10):  # many polls within a second
        bar.update(_task(done, total=3000))
    bar.update(_task(3000, total=3000, status="completed"))
    bar.finish()
    lines = out.getvalue().splitlines()
    assert 2 <= len(lines) <= 3, lines  # the first poll, maybe one more, and the end; not 300 redraws
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()
    assert "3,000/3,000 records" in lines[-1] and "completed" in lines[-1]


def test_running_is_told_apart_from_claimed_ahead() -> None:
    out = io.StringIO()
    bar = ProgressBar("search/ranker/twelve", stream=out)
    task = {"records": {"total": 12, "done": 1}, "status": "running",
            "subtasks": {"total": 12, "done": 1, "leased": 11, "running": 1, "pending": 0, "failed": 0,
                         "checking": 0, "cancelled": 0}}
    bar.update(task)
    assert "subtasks 1/12 done, 1 running, 10 claimed ahead" in out.getvalue()


def test_the_final_rate_is_the_tasks_own_not_the_watchers() -> None:
    out = io.StringIO()
    bar = ProgressBar("search/ranker/done", stream=out)
    # Watched only at its end: 6,000 records between its first claim and its end, 60 s apart.
    bar.update({"records": {"total": 6000, "done": 6000}, "status": "completed",
                "created_at": "2026-01-01T10:00:00+00:00", "started_at": "2026-01-01T10:00:30+00:00",
                "finished_at": "2026-01-01T10:01:30+00:00",
                "subtasks": {"total": 6, "done": 6, "leased": 0, "running": 0, "failed": 0}})
    bar.finish()
    assert "6,000/6,000 records 100.0% 100.0/s" in out.getvalue()


def test_the_rate_while_running_is_richs_recent_speed() -> None:
    clock = [1000.0]
    bar = ProgressBar("search/ranker/emb", stream=io.StringIO(), clock=lambda: clock[0])
    for second, done in enumerate((500, 520, 540, 560)):  # 500 done before it watched, then 20/s
        clock[0] = 1000.0 + second
        bar.update(_task(done, total=1000))
    assert bar.rate(_task(560, total=1000)) == pytest.approx(20.0)
    assert "ETA 0:22" in bar.render(_task(560, total=1000))
