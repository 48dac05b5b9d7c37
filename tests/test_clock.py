"""UTC timestamps (app/clock.py): each second formatted once, and both parts of a timestamp from one reading."""

from __future__ import annotations

import time

from app import clock


def test_a_timestamp_is_one_reading_of_the_clock(monkeypatch):
    readings = iter([1_795_960_000.9995, 1_795_960_001.0004])
    monkeypatch.setattr(time, "time", lambda: next(readings))
    assert clock.utc_millis() == "2026-11-29T13:46:40.999Z"  # two readings would have given 13:46:40.000
    assert clock.utc_millis() == "2026-11-29T13:46:41.000Z"


def test_each_second_is_its_own(monkeypatch):
    assert clock.utc_second(0) == "1970-01-01T00:00:00"
    assert clock.utc_second(86_399) == "1970-01-01T23:59:59"
    assert clock.utc_second(0) == "1970-01-01T00:00:00"
    monkeypatch.setattr(time, "time", lambda: 86_400.5)
    assert clock.utc_second() == "1970-01-02T00:00:00"
