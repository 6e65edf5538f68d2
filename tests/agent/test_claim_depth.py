"""The claim-ahead depth (agents/macos/claim_depth.py): one lease beyond the one running for long
subtasks, as deep as the round trips call for for short ones, never past the heartbeat's cap."""

from __future__ import annotations

import pytest

from minions.agents.macos.claim_depth import (
    MIN_DEPTH,
    TASKS_KEPT,
    ClaimDepth,
    MovingMax,
    MovingMedian,
    depth_for,
    heartbeat_cap,
    low_water_for,
)

LONG = ("search", "ranker", "long")
SHORT = ("search", "ranker", "short")


@pytest.mark.parametrize(("run_s", "round_trip_s", "claim_s", "cap", "want"), [
    (None, None, None, 32, MIN_DEPTH),  # nothing measured yet
    (30.0, None, None, 32, MIN_DEPTH),
    (30.0, 0.05, 0.01, 32, 2),  # the seed's 30 s subtasks: one beyond the one running
    (30.0, 20.0, 9.0, 32, 2),
    (30.0, 31.0, 0.0, 32, 3),  # a round trip longer than a subtask: two ready
    (0.1, 0.05, 0.05, 32, 2),
    (0.1, 0.25, None, 32, 4),  # ceil(2.5) ready + the one computing
    (0.1, 0.25, 0.05, 32, 4),  # ceil(3.0): a claim covered exactly
    (0.1, 0.25, 0.06, 32, 5),  # the claim counts twice: queued while it is in flight, and brought by it
    # 5 ms subtasks, a 5 ms claim, a 22 ms commit (the buffer's linger): the old rule's
    # ceil(27 / 5) + 1 = 7 left the device waiting; counting the claim again gives 8.
    (0.005, 0.027, 0.005, 32, 8),
    (0.001, 0.05, 0.01, 32, 32),  # capped
    (0.001, 0.05, 0.01, 10, 10),
    (0.0, 0.05, 0.01, 12, 12),  # nothing to hide a round trip behind: the cap
    (0.1, 0.25, 0.05, 1, MIN_DEPTH),  # the cap is never below MIN_DEPTH
])
def test_the_rule(run_s: float | None, round_trip_s: float | None, claim_s: float | None, cap: int,
                  want: int) -> None:
    assert depth_for(run_s, round_trip_s, claim_s, cap) == want


@pytest.mark.parametrize(("run_s", "claim_s", "fetch_s", "leases", "want"), [
    (None, None, None, 2, 1),  # nothing measured: claim when the queue is down to one
    (30.0, 0.05, 0.01, 2, 1),  # long subtasks: the next one claimed while one waits
    (0.005, 0.0046, 0.0001, 8, 1),  # one queued 5 ms subtask covers a 4.7 ms claim
    (0.005, 0.009, 0.002, 8, 3),  # ceil(11 / 5): three queued while the claim and fetch go on
    (0.001, 0.05, 0.0, 10, 9),  # never the whole bound: one is computing
    (0.0, 0.05, 0.0, 10, 9),
])
def test_the_low_water_mark(run_s: float | None, claim_s: float | None, fetch_s: float | None, leases: int,
                            want: int) -> None:
    assert low_water_for(run_s, claim_s, fetch_s, leases) == want


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


def test_moving_max_is_the_recent_worst() -> None:
    worst = MovingMax(window=3)
    assert worst.value is None
    for value in (0.1, 0.5, 0.2):
        worst.add(value)
    assert worst.value == 0.5
    worst.add(0.1)
    worst.add(0.1)  # 0.5 leaves the window
    assert worst.value == 0.2


def test_long_subtasks_hold_one_beyond_the_running_one() -> None:
    depth = ClaimDepth()
    assert depth.depth(30.0, 32).leases == MIN_DEPTH  # before the first subtask
    for _ in range(5):
        depth.claimed(0.04)
        depth.fetched(0.01)
        depth.committed(0.02)
        depth.ran(LONG, 30.0)
    d = depth.depth(30.0, 32)
    assert (d.leases, d.low_water, d.run_s, d.cap) == (2, 1, 30.0, MIN_DEPTH)
    assert d.round_trip_s == pytest.approx(0.07)
    assert (d.claim_s, d.fetch_s) == (0.04, 0.01)


def test_short_subtasks_pipeline_to_hide_the_round_trips() -> None:
    depth = ClaimDepth()
    for _ in range(5):
        depth.claimed(0.15)
        depth.fetched(0.05)
        depth.committed(0.1)
        depth.ran(SHORT, 0.1)
    d = depth.depth(1.0, 32)
    # ceil((0.3 + 0.15) / 0.1) = 5 ready + the one computing; the heartbeat allows 10; the claim is
    # sent with ceil(0.2 / 0.1) = 2 queued.
    assert (d.leases, d.low_water, d.cap) == (6, 2, 10)
    # A slower network: deeper, up to what one heartbeat interval finishes.
    for _ in range(5):
        depth.claimed(2.0)
    assert depth.depth(1.0, 32).leases == 10


def test_the_round_trips_count_by_their_recent_worst_not_their_median() -> None:
    """Leases lingering in the commit buffer leave together after its linger, and a slow complete
    holds its leases longer still: the device waits when one round trip outlasts its queue, so K
    (as C and F) is the worst of the recent ones."""
    depth = ClaimDepth()
    for committed in (0.006, 0.010, 0.014, 0.018, 0.022, 0.006, 0.010, 0.014, 0.018):
        depth.committed(committed)
        depth.claimed(0.005)
        depth.fetched(0.0)
        depth.ran(SHORT, 0.005)
    d = depth.depth(10.0, 32)
    assert d.round_trip_s == pytest.approx(0.005 + 0.022)  # the worst commit, not the median 0.014
    assert d.leases == 1 + 7  # ceil((0.027 + 0.005) / 0.005) = 7 ready


def test_the_depth_follows_the_task_the_device_ran_last() -> None:
    depth = ClaimDepth()
    depth.claimed(0.1)
    for _ in range(3):
        depth.ran(LONG, 30.0)
        depth.ran(SHORT, 0.05)
    assert depth.depth(30.0, 32).leases == 5  # ceil((0.1 + 0.1) / 0.05) + 1
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
