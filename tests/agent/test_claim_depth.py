"""The claim-ahead depth (agents/macos/claim_depth.py): one lease beyond the one running for long
subtasks, as deep as the round trips call for for short ones, never past the heartbeat's cap."""

from __future__ import annotations

import pytest

from minions.agents.macos.claim_depth import (
    MIN_DEPTH,
    TASKS_KEPT,
    ClaimDepth,
    MovingMedian,
    depth_for,
    heartbeat_cap,
)

LONG = ("search", "ranker", "long")
SHORT = ("search", "ranker", "short")


@pytest.mark.parametrize(("run_s", "round_trip_s", "cap", "want"), [
    (None, None, 32, MIN_DEPTH),  # nothing measured yet
    (30.0, None, 32, MIN_DEPTH),
    (30.0, 0.05, 32, 2),  # the seed's 30 s subtasks: one beyond the one running
    (30.0, 29.0, 32, 2),
    (30.0, 31.0, 32, 3),  # a round trip longer than a subtask: two ready
    (0.1, 0.05, 32, 2),
    (0.1, 0.1, 32, 2),
    (0.1, 0.25, 32, 4),  # ceil(2.5) ready + the one computing
    (0.001, 0.05, 32, 32),  # capped
    (0.001, 0.05, 10, 10),
    (0.0, 0.05, 12, 12),  # nothing to hide a round trip behind: the cap
    (0.1, 0.25, 1, MIN_DEPTH),  # the cap is never below MIN_DEPTH
])
def test_the_rule(run_s: float | None, round_trip_s: float | None, cap: int, want: int) -> None:
    assert depth_for(run_s, round_trip_s, cap) == want


def test_the_cap_is_what_finishes_in_one_heartbeat_at_most_one_claim() -> None:
    assert heartbeat_cap(None, 30.0, 32) == 32
    assert heartbeat_cap(0.1, 1.0, 32) == 10
    assert heartbeat_cap(0.01, 1.0, 32) == 32
    assert heartbeat_cap(30.0, 30.0, 32) == MIN_DEPTH
    assert heartbeat_cap(0.1, 1.0, 1) == MIN_DEPTH  # a server before batched claims


def test_moving_median_ignores_an_outlier_and_forgets_old_samples() -> None:
    median = MovingMedian(window=5)
    assert median.value is None
    for value in (0.1, 0.1, 9.0, 0.1, 0.1):
        median.add(value)
    assert median.value == 0.1
    for value in (2.0, 2.0, 2.0):
        median.add(value)
    assert median.value == 2.0


def test_long_subtasks_hold_one_beyond_the_running_one() -> None:
    depth = ClaimDepth()
    assert depth.depth(30.0, 32).leases == MIN_DEPTH  # before the first subtask
    for _ in range(5):
        depth.claimed(0.04)
        depth.outside_runner(0.03)
        depth.ran(LONG, 30.0)
    d = depth.depth(30.0, 32)
    assert (d.leases, d.run_s, d.cap) == (2, 30.0, MIN_DEPTH)
    assert d.round_trip_s == pytest.approx(0.07)


def test_short_subtasks_pipeline_to_hide_the_round_trips() -> None:
    depth = ClaimDepth()
    for _ in range(5):
        depth.claimed(0.2)
        depth.outside_runner(0.1)
        depth.ran(SHORT, 0.1)
    d = depth.depth(1.0, 32)
    # ceil(0.3 / 0.1) = 3 ready + the one computing; the heartbeat allows 10.
    assert (d.leases, d.cap) == (4, 10)
    # A slower network: deeper, up to what one heartbeat interval finishes.
    for _ in range(5):
        depth.claimed(2.0)
    assert depth.depth(1.0, 32).leases == 10


def test_the_depth_follows_the_task_the_device_ran_last() -> None:
    depth = ClaimDepth()
    depth.claimed(0.2)
    for _ in range(3):
        depth.ran(LONG, 30.0)
        depth.ran(SHORT, 0.05)
    assert depth.depth(30.0, 32).leases == 5  # ceil(0.2 / 0.05) + 1
    depth.ran(LONG, 30.0)
    assert depth.depth(30.0, 32).leases == 2
    # A task not measured yet starts at the minimum, however short the last one was.
    depth.ran(SHORT, 0.05)
    depth.ran(("search", "ranker", "new"), 30.0)
    assert depth.depth(30.0, 32).leases == 2


def test_only_so_many_tasks_are_remembered() -> None:
    depth = ClaimDepth()
    for n in range(TASKS_KEPT + 10):
        depth.ran(("t", "p", str(n)), 1.0)
    assert len(depth._run) == TASKS_KEPT
