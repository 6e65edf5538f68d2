"""How many leases the agent holds at once: as many as hide its round trips behind the work queued
for the device, and no more.

A lease held beside the one computing is work that a Mac which vanishes (sleeps, loses its network,
is killed) strands until the lease timeout. It buys something only while the device would otherwise
wait: once a lease ends, the slot it frees is filled by a claim, and the subtask it brings is ready
only after the claim's round trip, its input's fetch, and (counted against the lease it replaces)
that lease's upload and complete. Call that time L and a subtask's run time D: `ceil(L / D)` ready
subtasks keep the device busy meanwhile, so

    depth = clamp(ceil(L / D) + 1, MIN_DEPTH, cap)

leases: one computing and the ready ones. Long subtasks (D >= L) get MIN_DEPTH, one lease beyond
the one running, whose claim and input fetch happen while the other computes; short ones pipeline
as deep as the round trips call for, never deeper than `cap`: what the device finishes in one
heartbeat interval, and at most what one claim may take.

D is the moving median of recent subtasks' run time (the runner's own time), per task: a task's
subtasks are alike (one kind, model, params and size), where two tasks of one kind and model may take
30 s and 30 ms a subtask. The depth follows the task the device ran last; a task not measured yet
starts at MIN_DEPTH. L is the sum of the moving medians of the claim's
round trip and of a lease's time outside the runner (input fetch, output upload and complete). Medians,
so that one slow request or one stalled subtask does not move the depth. Before anything is measured,
MIN_DEPTH.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

# Fewest leases a pipelined agent holds: one computing, one ready to start.
MIN_DEPTH = 2
# Samples each moving median looks at.
WINDOW = 9
# Tasks whose run times are remembered (the oldest forgotten first).
TASKS_KEPT = 64

TaskKey = tuple[str, str, str]  # team, project, task name


@dataclass(frozen=True)
class Depth:
    """The depth and what it was worked out from (None: not measured yet)."""

    leases: int
    run_s: float | None
    round_trip_s: float | None
    cap: int


def depth_for(run_s: float | None, round_trip_s: float | None, cap: int) -> int:
    """The rule itself: ceil(round trip / run time) + 1, at least MIN_DEPTH, at most `cap` (which is
    at least MIN_DEPTH). Unmeasured: MIN_DEPTH. A run time of 0 (nothing to hide a round trip behind
    but more leases): `cap`."""
    cap = max(MIN_DEPTH, cap)
    if run_s is None or round_trip_s is None:
        return MIN_DEPTH
    if run_s <= 0:
        return cap
    ready = math.ceil(round_trip_s / run_s - 1e-9)  # (a ratio of exactly 3 is 3, not 3.0000000000000004)
    return max(MIN_DEPTH, min(cap, ready + 1))


def heartbeat_cap(run_s: float | None, heartbeat_interval_s: float, max_claim: int) -> int:
    """The deepest pipeline allowed: what the device finishes in one heartbeat interval (at least
    MIN_DEPTH), never more than one claim may take."""
    most = max(MIN_DEPTH, max_claim)
    if run_s is None or run_s <= 0:
        return most
    return max(MIN_DEPTH, min(most, int(heartbeat_interval_s / run_s)))


class MovingMedian:
    """The median of the last WINDOW samples (None before the first)."""

    def __init__(self, window: int = WINDOW) -> None:
        self._samples: deque[float] = deque(maxlen=window)

    def add(self, value: float) -> None:
        self._samples.append(max(0.0, value))

    @property
    def value(self) -> float | None:
        return statistics.median(self._samples) if self._samples else None


class ClaimDepth:
    """The measurements the depth is worked out from, fed by the agent's loop, and the depth."""

    def __init__(self) -> None:
        self._run: dict[TaskKey, MovingMedian] = {}
        self._current: TaskKey | None = None  # the task the device ran last
        self._claim = MovingMedian()
        self._outside = MovingMedian()

    def ran(self, task: TaskKey, seconds: float) -> None:
        """A subtask of `task` kept the runner this long."""
        if task not in self._run and len(self._run) >= TASKS_KEPT:
            del self._run[next(iter(self._run))]
        self._run.setdefault(task, MovingMedian()).add(seconds)
        self._current = task

    def claimed(self, seconds: float) -> None:
        """A claim that brought work took this long, answered at once (the server had work pending
        already: a long poll that waited for work measures the queue, not the round trip)."""
        self._claim.add(seconds)

    def outside_runner(self, seconds: float) -> None:
        """A lease spent this long outside the runner: its input fetch, its upload and complete."""
        self._outside.add(seconds)

    def run_s(self) -> float | None:
        return None if self._current is None else self._run[self._current].value

    def round_trip_s(self) -> float | None:
        claim, outside = self._claim.value, self._outside.value
        if claim is None and outside is None:
            return None
        return (claim or 0.0) + (outside or 0.0)

    def depth(self, heartbeat_interval_s: float, max_claim: int) -> Depth:
        run_s, round_trip_s = self.run_s(), self.round_trip_s()
        cap = heartbeat_cap(run_s, heartbeat_interval_s, max_claim)
        return Depth(depth_for(run_s, round_trip_s, cap), run_s, round_trip_s, cap)
