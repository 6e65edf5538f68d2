"""A live progress line for long operations: records done, rate, ETA."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def _duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class ProgressBar:
    def __init__(self, label: str, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.label = label
        self.stream = stream
        self.width = width
        self.started = time.monotonic()
        self._first_done: tuple[float, int] | None = None
        self._interactive = stream.isatty()
        self._last_line = ""
        self._last_print = 0.0

    def render(self, task: dict[str, Any]) -> str:
        total = task["records"]["total"] or 0
        done = task["records"]["done"] or 0
        now = time.monotonic()
        if self._first_done is None:
            self._first_done = (now, done)
        t0, d0 = self._first_done
        rate = (done - d0) / (now - t0) if now > t0 and done > d0 else 0.0
        fraction = done / total if total else 0.0
        filled = int(self.width * fraction)
        bar = "█" * filled + "░" * (self.width - filled)
        eta = _duration((total - done) / rate) if rate > 0 and total else "--:--"
        subtasks = task["subtasks"]
        return (f"{self.label} [{bar}] {done:,}/{total:,} records {fraction:6.1%} "
                f"{rate:,.1f}/s ETA {eta} · {task['status']} · subtasks {subtasks['done']}/{subtasks['total']}"
                f" done, {subtasks['leased']} running, {subtasks['failed']} failed")

    def update(self, task: dict[str, Any]) -> None:
        line = self.render(task)
        if self._interactive:
            self.stream.write("\r\x1b[2K" + line)
        elif line != self._last_line and (time.monotonic() - self._last_print >= 2 or task["status"] in (
                "completed", "failed", "cancelled")):
            # Logs and CI: a line every couple of seconds, not a redraw per poll.
            self.stream.write(line + "\n")
            self._last_print = time.monotonic()
        self._last_line = line
        self.stream.flush()

    def finish(self) -> None:
        if self._interactive:
            self.stream.write("\n")
        self.stream.flush()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
