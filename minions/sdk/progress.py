"""A live progress bar for long operations: records done, rate, ETA, state.

On a terminal it is a rich progress bar, redrawn in place and sized to the terminal's width (a long
task name is cut with an ellipsis; nothing wraps). Elsewhere (logs, CI, a pipe) it is a plain line
every couple of seconds and at the end, not a redraw per poll. The SDK's `wait(progress=True)` and
the CLI's `minions wait` / `submit --wait` show this one bar.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from minions.kinds import FINISHED_TASK_STATUSES

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID



def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBar:
    def __init__(self, label: str, stream: TextIO = sys.stderr, width: int = 30,
                 console: Console | None = None) -> None:
        self.label = label
        self.stream = stream
        self.width = width
        self.started = time.monotonic()
        self._first_done: tuple[float, int] | None = None
        self._interactive = console is not None or stream.isatty()
        self._console = console
        self._progress: Progress | None = None
        self._task_id: TaskID | None = None
        self._last_line = ""
        self._last_print = 0.0

    def _rate(self, done: int) -> float:
        now = time.monotonic()
        if self._first_done is None:
            self._first_done = (now, done)
        t0, d0 = self._first_done
        return (done - d0) / (now - t0) if now > t0 and done > d0 else 0.0

    def render(self, task: dict[str, Any]) -> str:
        """The plain line (logs and CI)."""
        total = task["records"]["total"] or 0
        done = task["records"]["done"] or 0
        rate = self._rate(done)
        fraction = done / total if total else 0.0
        filled = int(self.width * fraction)
        bar = "█" * filled + "░" * (self.width - filled)
        eta = _duration((total - done) / rate) if rate > 0 and total else "--:--"
        subtasks = task["subtasks"]
        return (f"{self.label} [{bar}] {done:,}/{total:,} records {fraction:6.1%} "
                f"{rate:,.1f}/s ETA {eta} · {task['status']} · subtasks {subtasks['done']}/{subtasks['total']}"
                f" done, {subtasks['leased']} running, {subtasks['failed']} failed")

    def _state(self, task: dict[str, Any]) -> str:
        failed = task["subtasks"]["failed"]
        return f"{task['status']}, {failed} failed" if failed else str(task["status"])

    def _start_live(self) -> None:
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

        console = self._console or Console(file=self.stream)
        self._progress = Progress(
            TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis",
                                                                  max_width=max(10, console.width // 5))),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TaskProgressColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[rate]}", table_column=Column(no_wrap=True)),
            TimeRemainingColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[state]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
            console=console, expand=True, refresh_per_second=4,
        )
        self._task_id = self._progress.add_task(self.label, total=None, rate="", state="")
        self._progress.start()

    def update(self, task: dict[str, Any]) -> None:
        if self._interactive:
            if self._progress is None:
                self._start_live()
            assert self._progress is not None and self._task_id is not None
            total = task["records"]["total"] or None
            done = task["records"]["done"] or 0
            self._progress.update(self._task_id, total=total, completed=done,
                                  rate=f"{self._rate(done):,.1f}/s", state=self._state(task))
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
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self.stream.flush()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
