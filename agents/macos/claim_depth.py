"""How many leases the agent holds at once, and when it sends the next claim: enough queued for the
device to hide the round trips, and no more.

A lease held beside the one computing is work that a Mac which vanishes (sleeps, loses its network,
is killed) strands until the lease timeout. It buys something only while the device would otherwise
wait. Call a subtask's run time D, a claim's round trip C, a lease's input fetch F and the time from
the end of its run until its complete is answered K (output upload, the commit buffer's linger,
the batched complete's round trip). In steady state a lease is held through all of that, and:

- a claim must be sent while the subtasks queued for the device still cover its round trip and
  their own inputs' fetch: the claim is sent when the queue is down to `low_water = ceil((C + F) / D)`
  (at least 1): the low-water mark;
- it must bring back at least what the device runs during the next claim's round trip (claims go one
  at a time), `C / D`, or the queue drains faster than claims refill it;
- and the leases whose runs have ended are still held for K, `K / D` of them.

So, with one lease computing,

    depth = clamp(ceil((C + F + K + C) / D) + 1, MIN_DEPTH, cap)

Long subtasks (D above the round trips) get MIN_DEPTH: one lease beyond the one running, whose claim
and input fetch happen while the other computes. Short ones pipeline as deep as the round trips call
for, never deeper than `cap`: what the device finishes in one heartbeat interval, and at most what one
claim may take.

A claim sent only once half the bound is free would leave half the depth unused; the low-water mark
sends it as soon as the queue needs it, taking all the room there is then.

D is the moving median of recent subtasks' run time (the runner's own time), per task: a task's
subtasks are alike (one kind, model, params and size), where two tasks of one kind and model may take
30 s and 30 ms a subtask; a median, so that one stalled subtask does not move the depth. The depth
follows the task the device ran last; a task not measured yet starts at MIN_DEPTH. C, F and K are
kept over every task (the network and the API, not the task, set them), each as the worst of its
last TAIL_WINDOW samples (MovingMax): the device waits whenever one round trip outlasts the queue,
not when a typical one does (on a loaded 2-core machine one complete in a dozen takes 3-5x the
median, and the leases it holds leave no room to claim). Against subtasks longer than the round
trips' worst, that worst is still below D: MIN_DEPTH. The heartbeat is on its own task and feeds
none of them. Before anything is measured, MIN_DEPTH.
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
# Round trips whose worst the queue covers: long enough to see the tail (one claim or complete in
# a dozen or so takes 5-10x the median on a loaded API), short enough to forget it within about a
# second of 5 ms subtasks.
TAIL_WINDOW = 32
# Tasks whose run times are remembered (the oldest forgotten first).
TASKS_KEPT = 64

TaskKey = tuple[str, str, str]  # team, project, task name


@dataclass(frozen=True)
class Depth:
    """The depth, the low-water mark, and what they were worked out from (None: not measured yet).
    `round_trip_s` is C + F + K, `claim_s` is C, `fetch_s` is F."""

    leases: int
    low_water: int
    run_s: float | None
    round_trip_s: float | None
    claim_s: float | None
    fetch_s: float | None
    cap: int


def _ceil_ratio(numerator: float, denominator: float) -> int:
    return math.ceil(numerator / denominator - 1e-9)  # (a ratio of exactly 3 is 3, not 3.0000000000000004)


def depth_for(run_s: float | None, round_trip_s: float | None, claim_s: float | None, cap: int) -> int:
    """The rule itself: ceil((round trip + claim) / run time) + 1, at least MIN_DEPTH, at most `cap`
    (which is at least MIN_DEPTH). Unmeasured: MIN_DEPTH. A run time of 0 (nothing to hide a round
    trip behind but more leases): `cap`."""
    cap = max(MIN_DEPTH, cap)
    if run_s is None or round_trip_s is None:
        return MIN_DEPTH
    if run_s <= 0:
        return cap
    ready = _ceil_ratio(round_trip_s + (claim_s or 0.0), run_s)
    return max(MIN_DEPTH, min(cap, ready + 1))


def low_water_for(run_s: float | None, claim_s: float | None, fetch_s: float | None, leases: int) -> int:
    """Subtasks queued for the device (claimed, not yet running) at or below which the next claim is
    sent: ceil((claim + fetch) / run time), at least 1, below `leases`. Unmeasured: 1."""
    if run_s is None or (claim_s is None and fetch_s is None):
        return 1
    if run_s <= 0:
        return max(1, leases - 1)
    return max(1, min(leases - 1, _ceil_ratio((claim_s or 0.0) + (fetch_s or 0.0), run_s)))


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


class MovingMax(MovingMedian):
    """The highest of the last TAIL_WINDOW samples (None before the first): the recent worst."""

    def __init__(self, window: int = TAIL_WINDOW) -> None:
        super().__init__(window)

    @property
    def value(self) -> float | None:
        return max(self._samples) if self._samples else None


class ClaimDepth:
    """The measurements the depth is worked out from, fed by the agent's loop, and the depth."""

    def __init__(self) -> None:
        self._run: dict[TaskKey, MovingMedian] = {}
        self._current: TaskKey | None = None  # the task the device ran last
        self._claim = MovingMax()
        self._fetch = MovingMax()
        self._commit = MovingMax()

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

    def fetched(self, seconds: float) -> None:
        """A lease's input took this long to fetch (0 when it rode in the claim)."""
        self._fetch.add(seconds)

    def committed(self, seconds: float) -> None:
        """A lease was held this long after its run: output upload, the commit buffer's linger, the
        complete's round trip."""
        self._commit.add(seconds)

    def run_s(self) -> float | None:
        return None if self._current is None else self._run[self._current].value

    def round_trip_s(self) -> float | None:
        """C + F + K (None before any was measured)."""
        parts = (self._claim.value, self._fetch.value, self._commit.value)
        if all(p is None for p in parts):
            return None
        return sum(p or 0.0 for p in parts)

    def depth(self, heartbeat_interval_s: float, max_claim: int) -> Depth:
        run_s, round_trip_s, claim_s, fetch_s = self.run_s(), self.round_trip_s(), self._claim.value, self._fetch.value
        cap = heartbeat_cap(run_s, heartbeat_interval_s, max_claim)
        leases = depth_for(run_s, round_trip_s, claim_s, cap)
        return Depth(leases, low_water_for(run_s, claim_s, fetch_s, leases), run_s, round_trip_s, claim_s,
                     fetch_s, cap)
