"""The CLI's times carry their zone: the reader's local time with the zone's name."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from minions.cli.times import shown_time


@pytest.fixture
def paris(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_an_api_time_is_shown_in_local_time_with_its_zone(paris: None) -> None:
    assert shown_time("2026-07-01T12:00:00.123456+00:00") == "2026-07-01 14:00:00 CEST"
    assert shown_time("2026-01-15T12:00:00Z") == "2026-01-15 13:00:00 CET"
    assert shown_time(datetime(2026, 1, 15, 12, tzinfo=UTC)) == "2026-01-15 13:00:00 CET"
    assert shown_time(datetime(2026, 1, 15, 12)) == "2026-01-15 13:00:00 CET"  # naive: UTC
    assert shown_time(None) == "-" and shown_time("", "default") == "default"
