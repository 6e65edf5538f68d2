"""The commit buffer (agents/macos/commit_buffer.py): a batch goes when `size` records wait, when
they have lingered `linger_s`, at once when no more are expected, and on close; one batch at a time;
a flush that fails keeps its records and sends them later."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from minions.agents.macos.commit_buffer import CommitBuffer


class Sink:
    """A flush function that records each batch and when it came; it may be made to fail or to hang."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.at: list[float] = []
        self.failures = 0
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, batch: list[int]) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.failures:
                self.failures -= 1
                raise ConnectionError("the flush failed")
            self.batches.append(list(batch))
            self.at.append(time.monotonic())
        finally:
            self.in_flight -= 1


async def until(condition: Callable[[], object], timeout_s: float = 2.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


async def test_a_full_buffer_flushes_at_once_without_waiting_out_the_linger() -> None:
    sink = Sink()
    buffer = CommitBuffer(sink, size=3, linger_s=60, most=100)
    started = time.monotonic()
    for i in range(3):
        buffer.add(i)
    await until(lambda: sink.batches)
    assert sink.batches == [[0, 1, 2]] and time.monotonic() - started < 1
    assert len(buffer) == 0


async def test_fewer_than_size_flush_once_they_have_lingered() -> None:
    sink = Sink()
    buffer = CommitBuffer(sink, size=8, linger_s=0.2, most=100)
    started = time.monotonic()
    buffer.add(1)
    await asyncio.sleep(0.05)
    buffer.add(2)  # gathered into the same batch: it came within the linger
    await asyncio.sleep(0.05)
    assert sink.batches == []  # still lingering
    await until(lambda: sink.batches)
    assert sink.batches == [[1, 2]]
    assert 0.18 <= sink.at[0] - started < 1.5


async def test_nothing_more_expected_means_no_linger() -> None:
    sink = Sink()
    buffer = CommitBuffer(sink, size=8, linger_s=60, most=100, more_expected=lambda: False)
    buffer.add(1)
    await until(lambda: sink.batches, timeout_s=1)
    assert sink.batches == [[1]]


async def test_close_flushes_what_waits_without_lingering() -> None:
    sink = Sink()
    buffer = CommitBuffer(sink, size=8, linger_s=60, most=100)
    buffer.add(1)
    buffer.add(2)
    started = time.monotonic()
    assert await buffer.close() == []
    assert sink.batches == [[1, 2]] and time.monotonic() - started < 1
    with pytest.raises(RuntimeError, match="closed"):
        buffer.add(3)


async def test_close_with_a_timeout_hands_back_what_was_never_answered() -> None:
    sink = Sink()
    sink.gate = asyncio.Event()  # the flush hangs (a server that never answers)
    buffer = CommitBuffer(sink, size=1, linger_s=0, most=100)
    buffer.add(1)
    await until(lambda: sink.in_flight == 1)
    assert await buffer.close(timeout_s=0.05) == [1]
    assert sink.batches == [] and sink.in_flight == 0


async def test_a_failed_flush_keeps_its_records_and_sends_them_later_first_in_line() -> None:
    sink = Sink()
    sink.failures = 1
    buffer = CommitBuffer(sink, size=2, linger_s=0.01, most=100, retry_s=0.1)
    buffer.add(1)
    buffer.add(2)
    await until(lambda: sink.failures == 0)
    assert sink.batches == [] and len(buffer) == 2  # kept, not lost
    buffer.add(3)
    await until(lambda: len(sink.batches) == 1)
    assert sink.batches == [[1, 2, 3]]  # after the retry pause, the kept ones first
    assert len(buffer) == 0


async def test_a_flush_that_fails_at_close_returns_its_records() -> None:
    sink = Sink()
    sink.failures = 1
    buffer = CommitBuffer(sink, size=8, linger_s=60, most=100)
    buffer.add(1)
    assert await buffer.close() == [1]
    assert sink.batches == []


async def test_one_batch_in_flight_those_meanwhile_go_together_at_most_most() -> None:
    sink = Sink()
    sink.gate = asyncio.Event()
    buffer = CommitBuffer(sink, size=2, linger_s=0.01, most=3, more_expected=lambda: False)
    buffer.add(0)
    await until(lambda: sink.in_flight == 1)
    for i in range(1, 8):  # all while the first is in flight
        buffer.add(i)
    sink.gate.set()
    await until(lambda: sum(len(b) for b in sink.batches) == 8)
    assert sink.batches == [[0], [1, 2, 3], [4, 5, 6], [7]]
    assert sink.most_in_flight == 1


def test_size_must_fit_in_a_batch() -> None:
    with pytest.raises(ValueError):
        CommitBuffer(Sink(), size=10, linger_s=0, most=5)
