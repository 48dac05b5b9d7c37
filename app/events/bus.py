"""The event bus: per-channel Redis streams for history, pub/sub wake-ups for live delivery.

Publishing appends to the channel's stream and publishes the same event on `wake:<channel>` in one
Lua script, so live order is stream order. Control messages ("these sessions ended") go on `control`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import redis

from ..auth.sessions import session_is_valid
from ..errors import ApiError, bad_request, validation_failed
from ..metrics import EVENTS_PUBLISHED
from ..redis import Keys
from .cursor import LAST_POSSIBLE_ID, is_after

WAKE_PREFIX = "wake:"
CONTROL_CHANNEL = "control"
BROADCAST = "broadcast"
DATA_LIMIT = 64 * 1024
HISTORY_BATCH = 500
CHANNEL_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
EVENT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")

# KEYS[1] the channel's stream, KEYS[2] the set of outgoing webhook endpoints, KEYS[3] their feed.
# ARGV: wake-up channel, maxlen, event name, data (JSON), ts, channel.
# XADD then PUBLISH in one atomic step: every subscriber sees events in stream order. While any
# outgoing endpoint exists, the event is also appended to the dispatcher's feed in the same step, so
# an event is either published and on its way to the endpoints, or not published at all.
PUBLISH_LUA = """
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*',
                      'event', ARGV[3], 'data', ARGV[4], 'ts', ARGV[5])
local wire = {id = id, channel = ARGV[6], event = ARGV[3], data = ARGV[4], ts = ARGV[5]}
redis.call('PUBLISH', ARGV[1], cjson.encode(wire))
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('XADD', KEYS[3], '*', 'id', id, 'channel', ARGV[6], 'event', ARGV[3], 'data', ARGV[4], 'ts', ARGV[5])
end
return id
"""

# KEYS: the set of outgoing webhook endpoints, their feed, then each event's stream. ARGV: maxlen, ts,
# then per event: wake-up channel, event name, data, channel.
# Every event appended and announced (and fed to outgoing webhooks, as in PUBLISH_LUA) in one atomic
# step: a batch is all there, or (refused before the script runs) none of it.
PUBLISH_MANY_LUA = """
local ids = {}
local outgoing = redis.call('EXISTS', KEYS[1]) == 1
for i = 3, #KEYS do
  local base = 2 + (i - 3) * 4
  local id = redis.call('XADD', KEYS[i], 'MAXLEN', '~', ARGV[1], '*',
                        'event', ARGV[base + 2], 'data', ARGV[base + 3], 'ts', ARGV[2])
  local wire = {id = id, channel = ARGV[base + 4], event = ARGV[base + 2], data = ARGV[base + 3], ts = ARGV[2]}
  redis.call('PUBLISH', ARGV[base + 1], cjson.encode(wire))
  if outgoing then
    redis.call('XADD', KEYS[2], '*', 'id', id, 'channel', ARGV[base + 4], 'event', ARGV[base + 2],
               'data', ARGV[base + 3], 'ts', ARGV[2])
  end
  ids[#ids + 1] = id
end
return ids
"""


@dataclass(slots=True)
class Event:
    """E: one event as stored in its channel's stream."""

    id: str
    channel: str
    event: str
    data: str  # the JSON text, kept encoded: it is written to clients as it is
    ts: str
    _json: str | None = field(default=None, repr=False, compare=False)

    def as_json(self, cursor: str | None = None, **extra) -> str:
        """`E` (docs/api.md) as JSON text, splicing in the stored data without decoding it.

        The plain form is made once per event: a broadcast hands the same object to every subscriber
        of the process, so thousands of deliveries share one serialisation.
        """
        if cursor is None and not extra:
            if self._json is None:
                self._json = self._render({})
            return self._json
        return self._render({**extra, **({"cursor": cursor} if cursor is not None else {})})

    def _render(self, extra: dict) -> str:
        head_json = json.dumps(
            {"id": self.id, "channel": self.channel, "event": self.event, **extra}, separators=(",", ":")
        )
        return f'{head_json[:-1]},"data":{self.data},"ts":{json.dumps(self.ts)}}}'

    @classmethod
    def from_wire(cls, raw: str) -> Event:
        """An event from the JSON the publish script sends on pub/sub."""
        fields = json.loads(raw)
        return cls(fields["id"], fields["channel"], fields["event"], fields["data"], fields["ts"])


def reset_event(channel: str) -> Event:
    """The event that tells a reader its cursor is older than the kept history."""
    data = json.dumps({"reason": "The cursor is older than the kept history; some events were dropped."})
    return Event("0-0", channel, "reset", data, _now())


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}Z"


WEBHOOKS = "webhooks"


USER_CHANNEL_PREFIX = "user:"


def user_channel(user_id: str) -> str:
    """The channel private to one user."""
    return USER_CHANNEL_PREFIX + user_id


def channels_for(user_id: str, is_admin: bool = False) -> list[str]:
    """What a reader receives: its own channel and the broadcast channel (admins: webhooks too)."""
    return [user_channel(user_id), BROADCAST] + ([WEBHOOKS] if is_admin else [])


def may_publish(user_id: str, is_admin: bool, channel: str) -> bool:
    """Users publish to their own channel; admins to any."""
    return is_admin or channel == user_channel(user_id)


def encode_data(data) -> str:
    """Event data as compact JSON text that every reader can parse: no NaN or Infinity, no lone surrogate."""
    try:
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        text.encode()
    except (ValueError, TypeError, UnicodeEncodeError):
        raise bad_request("Event data must be plain JSON (no NaN, Infinity or lone surrogates).") from None
    if len(text.encode()) > DATA_LIMIT:
        raise ApiError(413, "payload_too_large", f"Event data must be at most {DATA_LIMIT} bytes encoded.")
    return text


def validate_names(channel: str, event: str) -> None:
    """422 unless the channel and event names are of the allowed characters and length."""
    if not CHANNEL_PATTERN.fullmatch(channel):
        raise validation_failed("The channel name is not valid.")
    if not EVENT_NAME_PATTERN.fullmatch(event):
        raise validation_failed("The event name must be 1-100 letters, digits or _.:-")


class Bus:
    """Publishing and history reads over one Redis client (shared by every greenlet of the process)."""

    def __init__(self, client: redis.Redis, scripts, history_maxlen: int):
        self.client = client
        self.scripts = scripts
        self.history_maxlen = history_maxlen
        self._publish = client.register_script(PUBLISH_LUA)
        self._publish_many = client.register_script(PUBLISH_MANY_LUA)

    def publish(self, channel: str, event: str, data) -> Event:
        """Append an event to its channel's stream and wake live readers, in one atomic step."""
        validate_names(channel, event)
        encoded, ts = encode_data(data), _now()
        stream_id = self._publish(
            keys=[Keys.stream(channel), Keys.outgoing_endpoints(), Keys.outgoing_feed()],
            args=[WAKE_PREFIX + channel, self.history_maxlen, event, encoded, ts, channel],
        )
        EVENTS_PUBLISHED.inc()
        return Event(stream_id, channel, event, encoded, ts)

    def publish_many(self, events: list[tuple[str, str, object]]) -> list[str]:
        """Publish (channel, event, data) triples all together or not at all; their ids, in order."""
        for channel, event, _ in events:
            validate_names(channel, event)
        encoded = [encode_data(data) for _, _, data in events]  # every one checked before anything is written
        args = [self.history_maxlen, _now()]
        for (channel, event, _), data in zip(events, encoded, strict=True):
            args += [WAKE_PREFIX + channel, event, data, channel]
        keys = [Keys.outgoing_endpoints(), Keys.outgoing_feed()] + [Keys.stream(channel) for channel, _, _ in events]
        ids = self._publish_many(keys=keys, args=args)
        EVENTS_PUBLISHED.inc(len(ids))
        return list(ids)

    def announce_sessions_ended(self, user_id: str, session_ids: list[str], whole_user: bool = False) -> None:
        """Tell every worker of every instance to close these sessions' connections."""
        message = {"user_id": user_id, "session_ids": session_ids, "whole_user": whole_user}
        self.client.publish(CONTROL_CHANNEL, json.dumps(message))

    def present(self, channels: list[str]) -> dict[str, str]:
        """The position just after the newest event of each channel (0-0 for a channel never used)."""
        info = self._stream_info(channels)
        return {channel: (i or {}).get("last-generated-id", "0-0") for channel, i in zip(channels, info, strict=False)}

    def trimmed_past(self, positions: dict[str, str]) -> list[str]:
        """Channels whose kept history no longer reaches back to the given position.

        Trimming removes the oldest entries, so events after a position were lost when entries were
        trimmed and the oldest kept entry is after the position. (A position exactly on the newest
        trimmed entry also counts: at worst an unneeded reset, never a silent gap.)
        """
        channels = list(positions)
        trimmed = []
        for channel, info in zip(channels, self._stream_info(channels), strict=True):
            if not info or int(info.get("entries-added", 0)) <= int(info.get("length", 0)):
                continue
            first = info.get("recorded-first-entry-id") or (info.get("first-entry") or ["0-0"])[0]
            if is_after(first, positions[channel]):
                trimmed.append(channel)
        return trimmed

    def read_after(self, positions: dict[str, str], limit: int = HISTORY_BATCH) -> tuple[list[Event], bool]:
        """Events after each position (up to `limit` per channel), and whether more remain."""
        pipe = self.client.pipeline(transaction=False)
        channels = [channel for channel, position in positions.items() if position != LAST_POSSIBLE_ID]
        for channel in channels:
            pipe.xrange(Keys.stream(channel), f"({positions[channel]}", "+", count=limit)
        events, more = [], False
        for channel, entries in zip(channels, pipe.execute(), strict=False):
            events.extend(Event(i, channel, f["event"], f["data"], f["ts"]) for i, f in entries)
            more = more or len(entries) == limit
        return events, more

    def session_is_valid(self, caller) -> bool:
        """Re-check a live connection's session (after a reconnect a control message may be lost)."""
        return session_is_valid(caller.user_id, caller.session_id, caller.token_version, self.scripts)

    def _stream_info(self, channels: list[str]) -> list[dict | None]:
        pipe = self.client.pipeline(transaction=False)
        for channel in channels:
            pipe.xinfo_stream(Keys.stream(channel))
        results = pipe.execute(raise_on_error=False)
        for result in results:
            if isinstance(result, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
                raise result
        return [None if isinstance(r, Exception) else r for r in results]
