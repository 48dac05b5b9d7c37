"""Replay: every event of the kept history since a cursor or a time that an endpoint's filters match,
sent to it again (messages it had already are queued again with their `webhook-id`; others are made).

The history is each channel's stream (EVENT_HISTORY_MAXLEN events per channel), so a replay reaches as
far back as that history does. `user:*` and `*` filters replay every channel of that kind found.
"""

from __future__ import annotations

import redis

from ..events.bus import Event
from ..events.cursor import LAST_POSSIBLE_ID, parse_id
from ..redis import Keys
from .store import Endpoint, OutgoingStore

REPLAY_LIMIT = 10_000  # events per request; a later `since` replays what lies beyond


def history_channels(client: redis.Redis, filters: tuple[str, ...]) -> list[str]:
    """The channels with kept history that these channel filters name."""
    channels = {name for name in filters if not name.endswith("*")}
    patterns = [Keys.stream(name) for name in filters if name.endswith("*")]  # `*` and `<namespace>:*`
    for pattern in patterns:
        for key in client.scan_iter(match=pattern, count=1000, _type="stream"):
            channels.add(Keys.stream_channel(key))
    return sorted(channels)


def replay_events(
    store: OutgoingStore, client: redis.Redis, record: dict, positions: dict[str, str] | None, since_ms: int | None
) -> int:
    """Queue the endpoint's matching events after `positions` (a cursor's) or from `since_ms`; how many."""
    endpoint = Endpoint.from_record(record)
    events: list[Event] = []
    for channel in history_channels(client, endpoint.channels):
        if positions is not None:
            position = positions.get(channel, "0-0")
            if position == LAST_POSSIBLE_ID:
                continue
            start = "-" if position == "0-0" else f"({position}"
        else:
            start = f"{since_ms}-0"
        for event_id, fields in client.xrange(Keys.stream(channel), start, "+", count=REPLAY_LIMIT):
            if endpoint.wants(channel, fields["event"]):
                events.append(Event.from_entry(event_id, channel, fields))
    events.sort(key=lambda event: parse_id(event.id))
    items = [(e.id, e.channel, e.event, e.as_json()) for e in events[:REPLAY_LIMIT]]
    return store.enqueue(endpoint.id, items, force=True)
