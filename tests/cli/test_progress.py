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
