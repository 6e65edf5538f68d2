"""A live progress bar for long operations: records done, rate, ETA, what runs.

The maths (speed over a sliding window of samples, time remaining) is rich's `Progress`, in both
modes. On a terminal it is drawn by rich too, redrawn in place and sized to the terminal's width (a
long task name is cut with an ellipsis; nothing wraps). Elsewhere (logs, CI, a pipe) it is a plain
line every couple of seconds and at the end, not a redraw per poll. The SDK's `wait(progress=True)`
and the CLI's `minions wait` / `submit --wait` show this one bar.

What runs is the task's `subtasks.running` (API.md): the leases being worked on, not those an
agent claimed ahead of its work, which are shown apart ("1 running, 10 claimed ahead"). Once the
task has ended, the rate is the task's own (records over its first claim to its end), not the rate
seen while this bar watched.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from minions.kinds import FINISHED_TASK_STATUSES

if TYPE_CHECKING:
    from rich.console import Console


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def task_seconds(task: dict[str, Any]) -> float | None:
    """How long an ended task ran: its first claim (else its submission) to its end."""
    start, end = task.get("started_at") or task.get("created_at"), task.get("finished_at")
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def task_rate(task: dict[str, Any]) -> float | None:
    """An ended task's records per second over its own run time; None while it runs."""
    seconds = task_seconds(task)
    if seconds is None:
        return None
    return (task["records"]["done"] or 0) / seconds if seconds > 0 else 0.0


def subtask_line(subtasks: dict[str, Any]) -> str:
    """'3/12 done, 1 running, 8 claimed ahead, 1 failed': running apart from claimed ahead."""
    leased = subtasks.get("leased") or 0
    running = subtasks.get("running", leased) or 0
    parts = [f"{subtasks.get('done') or 0}/{subtasks.get('total') or 0} done", f"{running} running"]
    if leased > running:
        parts.append(f"{leased - running} claimed ahead")
    if subtasks.get("checking"):
        parts.append(f"{subtasks['checking']} checking")
    if subtasks.get("failed"):
        parts.append(f"{subtasks['failed']} failed")
    return ", ".join(parts)


class ProgressBar:
    def __init__(self, label: str, stream: TextIO = sys.stderr, width: int = 30,
                 console: Console | None = None, clock: Callable[[], float] | None = None) -> None:
        self.label = label
        self.stream = stream
        self.width = width
        self.started = time.monotonic()
        self._interactive = console is not None or stream.isatty()
        # Imported here: `import minions.sdk` stays light for programs that never show a bar.
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
        )
        from rich.table import Column

        # Off a terminal rich still keeps the samples (speed, time remaining); it draws nothing.
        console = console or Console(file=stream if self._interactive else io.StringIO())
        self._progress = Progress(
            TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis",
                                                                  max_width=max(10, console.width // 5))),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TaskProgressColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[rate]}", table_column=Column(no_wrap=True)),
            TimeRemainingColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[state]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
            console=console, expand=True, refresh_per_second=4, disable=not self._interactive,
            get_time=clock,
        )
        self._task_id = self._progress.add_task(label, total=None, rate="", state="")
        self._live = False
        self._last_line = ""
        self._last_print = 0.0

    def rate(self, task: dict[str, Any]) -> float:
        """Records per second: the task's own once it ended, else rich's recent speed."""
        ended = task_rate(task) if task["status"] in FINISHED_TASK_STATUSES else None
        if ended is not None:
            return ended
        return self._progress.tasks[self._task_id].speed or 0.0

    def _record(self, task: dict[str, Any]) -> None:
        total = task["records"]["total"] or None
        done = task["records"]["done"] or 0
        self._progress.update(self._task_id, total=total, completed=done,
                              rate=f"{self.rate(task):,.1f}/s", state=self._state(task))

    def render(self, task: dict[str, Any]) -> str:
        """The plain line (logs and CI), from the samples `update` recorded."""
        total = task["records"]["total"] or 0
        done = task["records"]["done"] or 0
        fraction = done / total if total else 0.0
        filled = int(self.width * fraction)
        bar = "█" * filled + "░" * (self.width - filled)
        remaining = self._progress.tasks[self._task_id].time_remaining
        eta = _duration(remaining) if remaining is not None and total else "--:--"
        return (f"{self.label} [{bar}] {done:,}/{total:,} records {fraction:6.1%} "
                f"{self.rate(task):,.1f}/s ETA {eta} · {task['status']} · subtasks "
                f"{subtask_line(task['subtasks'])}")

    @staticmethod
    def _state(task: dict[str, Any]) -> str:
        subtasks = task["subtasks"]
        if task["status"] in FINISHED_TASK_STATUSES:
            failed = subtasks.get("failed") or 0
            return f"{task['status']}, {failed} failed" if failed else str(task["status"])
        leased = subtasks.get("leased") or 0
        running = subtasks.get("running", leased) or 0
        ahead = f", {leased - running} ahead" if leased > running else ""
        return f"{task['status']}: {running} running{ahead}"

    def update(self, task: dict[str, Any]) -> None:
        self._record(task)
        if self._interactive:
            if not self._live:
                self._progress.start()
                self._live = True
            return
        line = self.render(task)
        finished = task["status"] in FINISHED_TASK_STATUSES
        if line != self._last_line and (time.monotonic() - self._last_print >= 2 or finished):
            # Logs and CI: a line every couple of seconds, not a redraw per poll.
            self.stream.write(line + "\n")
            self._last_print = time.monotonic()
            self.stream.flush()
        self._last_line = line

    def finish(self) -> None:
        if self._live:
            self._progress.stop()
            self._live = False
        self.stream.flush()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
