"""History reads keep the events they made (`RecentEvents`): readers resuming together share one event, and
its encodings, for each entry; an entry whose fields differ from the kept event's gets its own."""

from __future__ import annotations

import json

from app.events.bus import RecentEvents


def fields(n: int, **changed) -> dict:
    return {"event": "note", "data": json.dumps({"n": n}), "ts": "2026-11-26T20:00:00.000Z", **changed}


def test_readers_of_the_same_entry_share_one_event_and_its_encoding():
    recent = RecentEvents()
    first = recent.event("1-0", "broadcast", fields(1))
    tail = first.sse_tail()
    again = recent.event("1-0", "broadcast", fields(1))  # another reader's XRANGE: equal fields, new dict
    assert again is first and again.sse_tail() is tail
    assert recent.event("1-0", "user:a", fields(1)) is not first  # the same id in another channel: its own


def test_an_entry_whose_fields_differ_from_the_kept_event_gets_its_own():
    recent = RecentEvents()
    kept = recent.event("1-0", "room:a", fields(1))
    for different in (
        fields(2),
        fields(1, event="other"),
        fields(1, ts="2026-11-26T20:00:01.000Z"),
        fields(1, **{"from": "u"}),
    ):
        event = recent.event("1-0", "room:a", different)  # the channel deleted and written again, the id reused
        assert event is not kept and (event.data, event.event, event.ts) == (
            different["data"],
            different["event"],
            different["ts"],
        )
        assert event.sender == different.get("from")
        kept = event
    assert recent.bytes == len(kept.data) and len(recent.kept) == 1


def test_the_kept_events_are_bounded_by_their_data_oldest_let_go_first():
    recent = RecentEvents(max_bytes=100)
    big = {"event": "e", "data": json.dumps("x" * 38), "ts": "t"}  # 40 bytes of data each
    first, second = recent.event("1-0", "c", big), recent.event("2-0", "c", big)
    assert recent.event("1-0", "c", big) is first and recent.bytes == 80
    recent.event("3-0", "c", big)  # 120 bytes: the oldest goes
    assert recent.bytes == 80 and list(recent.kept) == [("c", "2-0"), ("c", "3-0")]
    assert recent.event("2-0", "c", big) is second and recent.event("1-0", "c", big) is not first
