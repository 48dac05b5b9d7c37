"""UTC timestamps as the service writes them, each second's part formatted once (strftime was a visible part of
a publication's and an access line's cost)."""

from __future__ import annotations

import time

_formatted: list = [None, ""]  # the second last formatted, and its text


def utc_second(second: int | None = None) -> str:
    """`second` (default: now) as 2026-11-29T13:44:11, in UTC."""
    if second is None:
        second = int(time.time())
    if _formatted[0] != second:
        _formatted[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return _formatted[1]


def utc_millis() -> str:
    """Now as 2026-11-29T13:44:11.123Z: one reading of the clock for both parts."""
    now = time.time()
    return f"{utc_second(int(now))}.{int(now * 1000) % 1000:03d}Z"
