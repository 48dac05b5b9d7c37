"""The event bus: per-channel Redis streams for history, pub/sub wake-ups for live delivery.

Publishing appends to the channel's stream (`events:{C}`) and publishes the same event on its wake-up
channel (`wake:{C}`, the same hash slot) in one Lua script, so live order is stream order: PUBLISH on one
Redis, SPUBLISH (sharded pub/sub) on a Redis Cluster. Control messages ("these sessions ended") go on
`control`, a sharded channel too on a cluster.

With `EVENT_DURABILITY=replicated` a publication is answered only after a replica has it: WAIT on the
connection that ran the script (else 503; the event may still be delivered: at least once).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import redis

from ..auth.sessions import checked_user, session_check, session_is_valid
from ..clock import utc_millis
from ..errors import ApiError, bad_request, validation_failed
from ..metrics import EVENTS_PUBLISHED
from ..outgoing.feed import feed_events
from ..redis import Keys, is_cluster, shared_pipelines, shared_round_trips
from .cursor import LAST_POSSIBLE_ID, is_after, packed_position, parse_id

CONTROL_CHANNEL = "control"
BROADCAST = "broadcast"
DATA_LIMIT = 64 * 1024
HISTORY_BATCH = 500
CHANNEL_PATTERN = re.compile(r"^[A-Za-z0-9_.:=@-]{1,128}$")
EVENT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
# Names of what the service itself sends (control messages, frames, its own events): nobody may publish
# them, in any letter case, or a client could take an event for the service's word (drop a room, reset).
RESERVED_EVENT_NAMES = frozenset(
    {"reset", "session_ended", "subscribed", "unsubscribed", "welcome", "error", "ack", "pong"}
)
RESERVED_EVENT_PREFIX = "presence."
DEFAULT_HISTORY_TTL = 7 * 24 * 3600  # seconds a channel's history is kept after its last publication
NEVER_USED = "0-0"  # where a channel that was never written stands
REPLICA_WAIT_MILLISECONDS = 1000  # how long a replicated publication waits for a replica before its 503
MOVED_RETRIES = 2  # a slot that moved under a publication: refresh the slot map and send it again
# Answers to a publish script on a cluster node that no longer serves the slot: the script did not run.
PLACED_ELSEWHERE = (redis.exceptions.MovedError, redis.exceptions.ReadOnlyError)


def wake_channel(channel: str) -> str:
    """The Redis pub/sub channel of a bus channel: in the hash slot of its stream `events:{<channel>}`."""
    return f"wake:{{{channel}}}"


def channel_of_wake(name: str) -> str:
    """The bus channel of a wake-up channel (the inverse of `wake_channel`)."""
    return name.removeprefix("wake:{").removesuffix("}")


# KEYS: each event's stream, all in one hash slot; on one Redis also, last, the set of outgoing webhook
# endpoints and their feed. ARGV: the publish command (PUBLISH or SPUBLISH), maxlen, ts, the number of
# events, the history's time to live (ms), then per event: wake-up channel, event name, data (JSON),
# channel, sender ("" for none).
# Each XADD is followed by its PUBLISH in one atomic step: every subscriber sees events in stream order,
# and the events are all appended, or none. Each publication renews its stream's time to live, so a
# channel nobody publishes to any more (names are free to make up) leaves Redis. On one Redis, while any
# outgoing endpoint exists, each event is also appended to the dispatcher's feed in the same step (a
# cluster cannot: the feed is in another slot, and Bus._feed_outgoing appends it as a second step).
PUBLISH_LUA = """
local count = tonumber(ARGV[4])
local feed = #KEYS == count + 2 and redis.call('EXISTS', KEYS[count + 1]) == 1
local ids = {}
for i = 1, count do
  local base = 5 + (i - 1) * 5
  local fields = {'event', ARGV[base + 2], 'data', ARGV[base + 3], 'ts', ARGV[3]}
  if ARGV[base + 5] ~= '' then
    table.insert(fields, 'from')
    table.insert(fields, ARGV[base + 5])
  end
  local id = redis.call('XADD', KEYS[i], 'MAXLEN', '~', ARGV[2], '*', unpack(fields))
  redis.call('PEXPIRE', KEYS[i], ARGV[5])
  local wire = {id = id, channel = ARGV[base + 4], event = ARGV[base + 2], data = ARGV[base + 3], ts = ARGV[3]}
  if ARGV[base + 5] ~= '' then
    wire['from'] = ARGV[base + 5]
  end
  redis.call(ARGV[1], ARGV[base + 1], cjson.encode(wire))
  if feed then
    redis.call('XADD', KEYS[count + 2], '*', 'id', id, 'channel', ARGV[base + 4], unpack(fields))
  end
  ids[i] = id
end
return ids
"""

# PUBLISH_LUA for a caller whose API key this worker has verified before (its scopes and channels never change):
# only while the key's record exists, and the namespace when one is named, in the same atomic step, so a key or
# namespace deleted meanwhile publishes nothing. Two more KEYS (the key's record, the namespaces hash) and three
# more ARGV (now, the touch interval, the namespace or ''), taken off before the publication's own; last_used_at
# is touched as the key's verification touches it. Nil when refused.
PUBLISH_WHILE_KEY_LUA = (
    """
local namespaces = table.remove(KEYS)
local record = table.remove(KEYS)
local namespace = table.remove(ARGV)
local interval = table.remove(ARGV)
local now = table.remove(ARGV)
local found = redis.call('HMGET', record, 'id', 'last_used_at')
if not found[1] then return nil end
if namespace ~= '' and redis.call('HEXISTS', namespaces, namespace) == 0 then return nil end
if tonumber(now) - (tonumber(found[2]) or 0) >= tonumber(interval) then
  redis.call('HSET', record, 'last_used_at', now)
end
"""
    + PUBLISH_LUA
)


class NotReplicated(ApiError):
    """503: no replica acknowledged a replicated publication in time (it may still be delivered)."""

    def __init__(self):
        super().__init__(
            503,
            "unavailable",
            "No replica confirmed the event in time; it may still be delivered. Retry shortly.",
            {"Retry-After": "1"},
        )


@dataclass(slots=True)
class Event:
    """E: one event as stored in its channel's stream."""

    id: str
    channel: str
    event: str
    data: str  # the JSON text, kept encoded: it is written to clients as it is
    ts: str
    sender: str | None = None  # the user who published it with an access token (`from` in E)
    _json: str | None = field(default=None, repr=False, compare=False)
    _sse_tail: bytes | None = field(default=None, repr=False, compare=False)
    order: tuple[int, int] = field(init=False, repr=False, compare=False)  # the id as numbers, for comparing
    _message_parts: tuple[bytes, bytes] | None = field(default=None, repr=False, compare=False)
    _packed: bytes | None = field(default=None, repr=False, compare=False)

    def packed(self) -> bytes:
        """The id as a compact cursor holds it, packed once for all of the event's readers."""
        if self._packed is None:
            self._packed = packed_position(self.id)
        return self._packed

    def message_parts(self) -> tuple[bytes, bytes]:
        """The WebSocket event message, `as_json(cursor, type="event")`, cut where the cursor goes: each
        reader's message is head + its cursor + tail, and the two parts are made once per event."""
        if self._message_parts is None:
            head, _, tail = self._render({"type": "event", "cursor": "\0"}).partition('"\\u0000"')
            self._message_parts = (f'{head}"'.encode(), f'"{tail}'.encode())
        return self._message_parts

    def __post_init__(self):
        self.order = parse_id(self.id)  # once per event, not once per reader

    def sse_tail(self) -> bytes:
        """The SSE message after its `id:` line (`event:`, `data:`, blank line), made once per event."""
        if self._sse_tail is None:
            self._sse_tail = f"event: {self.event}\ndata: {self.as_json()}\n\n".encode()
        return self._sse_tail

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
        head = {"id": self.id, "channel": self.channel, "event": self.event}
        if self.sender is not None:
            head["from"] = self.sender
        head_json = json.dumps({**head, **extra}, separators=(",", ":"))
        return f'{head_json[:-1]},"data":{self.data},"ts":{json.dumps(self.ts)}}}'

    @classmethod
    def from_wire(cls, raw: str) -> Event:
        """An event from the JSON the publish script sends on pub/sub."""
        fields = json.loads(raw)
        return cls(fields["id"], fields["channel"], fields["event"], fields["data"], fields["ts"], fields.get("from"))

    @classmethod
    def from_entry(cls, event_id: str, channel: str, fields: dict) -> Event:
        """An event from its stream entry's (or the outgoing feed entry's) fields."""
        return cls(event_id, channel, fields["event"], fields["data"], fields["ts"], fields.get("from"))


def reset_event(channel: str) -> Event:
    """The event that tells a reader its cursor is older than the kept history."""
    data = json.dumps({"reason": "The cursor is older than the kept history; some events were dropped."})
    return Event("0-0", channel, "reset", data, utc_millis())


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


def is_reserved_event_name(event: str) -> bool:
    """Whether only the service may send an event of this name (any letter case)."""
    name = event.lower()
    return name in RESERVED_EVENT_NAMES or name.startswith(RESERVED_EVENT_PREFIX)


RESERVED_MESSAGE = (
    "The event name is reserved: the service itself sends reset, session_ended, subscribed, unsubscribed, "
    "welcome, error, ack, pong and presence.* (in any letter case)."
)


def validate_names(channel: str, event: str) -> None:
    """422 unless the channel and event names are of the allowed characters and length, and the event's
    name is not one of those the service itself sends."""
    if not CHANNEL_PATTERN.fullmatch(channel):
        raise validation_failed("The channel name is not valid.")
    if not EVENT_NAME_PATTERN.fullmatch(event):
        raise validation_failed("The event name must be 1-100 letters, digits or _.:-")
    if is_reserved_event_name(event):
        raise validation_failed(RESERVED_MESSAGE)


# KEYS: channels' streams. For each: {its last id (0-0 when never written), the oldest id it keeps if it ever
# dropped entries (else ''), its first entry's id if it never dropped any (else '')}. A short answer: XINFO
# STREAM's whole one (with its first and last entries) stays in Redis. The entries themselves are read by
# plain XRANGEs beside it: passed through Lua, each entry's fields were made into Lua strings and back, which
# cost Redis several times the XRANGE itself.
STREAM_POSITIONS_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  local last, oldest, first = '0-0', '', ''
  if redis.call('EXISTS', key) == 1 then
    local info = redis.call('XINFO', 'STREAM', key)
    local field = {}
    for j = 1, #info, 2 do field[info[j]] = info[j + 1] end
    last = field['last-generated-id']
    if (field['entries-added'] or 0) > field['length'] then
      oldest = field['recorded-first-entry-id'] or (field['first-entry'] or {'0-0'})[1]
    elseif field['first-entry'] then
      first = field['first-entry'][1]
    end
  end
  out[i] = {last, oldest, first}
end
return out
"""


ScriptCall = tuple  # (a registered redis-py Script, its keys, its arguments)


class StreamRead(NamedTuple):
    """What a reader read of one channel's stream (`Bus._read_streams`)."""

    last: str  # the position just after its newest event (0-0 for a channel never used)
    oldest: str  # the oldest id it keeps if it ever dropped entries (trimmed), else ""
    first: str  # its first entry's id if it never dropped entries, else ""
    entries: list  # (id, fields) of the events after the reader's position

    def lost_after(self, position: str) -> bool:
        """Whether events after `position` may be gone: trimmed away, or expired with a former history of the
        channel. A stream that never dropped entries holds no position before its first entry other than
        0-0 (where a channel never used stands): such a position is from a history that expired since."""
        if self.oldest:
            return is_after(self.oldest, position)
        return bool(self.first) and position != NEVER_USED and is_after(self.first, position)


class Opening(NamedTuple):
    """A reader's first reads (`Bus.opening`)."""

    checked: list  # each check's answer, then each of its plain reads' (`reads`), in order
    present: dict[str, str]  # channel -> the position just after its newest event
    trimmed: list[str]  # channels whose kept history no longer reaches back to the reader's position
    first: tuple[list[Event], bool]  # the first events after the positions, and whether more remain


class RecentEvents:
    """The events history reads found lately, by channel and id, up to `max_bytes` of their data. Readers
    resuming together (after a reload, thousands at once) read the same events: each is made, and encoded
    for SSE and WebSocket, once for all of them rather than once per reader. A kept event is used only while
    its entry's fields are the same (a channel deleted and written again may reuse an id)."""

    def __init__(self, max_bytes: int = 4 * 1024 * 1024):
        self.max_bytes = max_bytes
        self.kept: dict[tuple[str, str], Event] = {}
        self.bytes = 0

    def event(self, event_id: str, channel: str, fields: dict) -> Event:
        """The event of a stream entry: the one kept for it, or a new one (then kept, the oldest let go)."""
        key = (channel, event_id)
        kept = self.kept.get(key)
        if (
            kept is not None
            and kept.data == fields["data"]
            and kept.event == fields["event"]
            and kept.ts == fields["ts"]
            and kept.sender == fields.get("from")
        ):
            return kept
        event = Event.from_entry(event_id, channel, fields)
        if kept is not None:
            self.bytes -= len(self.kept.pop(key).data)
        self.kept[key] = event
        self.bytes += len(event.data)
        while self.bytes > self.max_bytes:
            self.bytes -= len(self.kept.pop(next(iter(self.kept))).data)
        return event


class Bus:
    """Publishing and history reads over one Redis client (shared by every greenlet of the process)."""

    def __init__(
        self,
        client: redis.Redis,
        scripts,
        history_maxlen: int,
        durability: str = "async",
        history_ttl: int = DEFAULT_HISTORY_TTL,  # EVENT_HISTORY_TTL_SECONDS
    ):
        self.client = client
        self.scripts = scripts
        self.history_maxlen = history_maxlen
        self.history_ttl = history_ttl  # seconds a channel's history outlives its last publication
        # What users (not admins) may publish: `take(user_id, count)` raises 429 past it (app/limits.py).
        self.publish_limit = None
        self.cluster = is_cluster(client)
        self.replicated = durability == "replicated"
        self._publish = client.register_script(PUBLISH_LUA)
        # Publications of concurrent requests share round trips; each is still its own atomic step.
        self._publish_shared = shared_round_trips(client, self._publish)
        self._publish_while_key = shared_round_trips(client, client.register_script(PUBLISH_WHILE_KEY_LUA))
        self._stream_positions = client.register_script(STREAM_POSITIONS_LUA)
        self._read = shared_pipelines(client)  # history reads of readers resuming together share round trips
        self.recent = RecentEvents()

    def publish(
        self, channel: str, event: str, data, sender: str | None = None, sender_is_admin: bool = False
    ) -> Event:
        """Append an event to its channel's stream and wake live readers, in one atomic step.

        `sender`: the user publishing with an access token (E's `from`); None for keys, the CLI, webhooks.
        A sender other than an admin (`sender_is_admin`) is held to the publish limit (429)."""
        validate_names(channel, event)
        encoded, ts = encode_data(data), utc_millis()
        self._count_against_limit(sender, sender_is_admin, 1)
        (event_id,) = self._append([(channel, event, encoded)], ts, sender)
        return Event(event_id, channel, event, encoded, ts, sender)

    @property
    def checks_keys(self) -> bool:
        """Whether `publish_while_key` may be used: on one Redis, without waiting for a replica."""
        return not (self.cluster or self.replicated)

    def publish_while_key(
        self, channel: str, event: str, data, key_record: str, touch: list, namespace: str | None
    ) -> Event | None:
        """`publish` with an API key verified before, in one step with what only Redis knows now: the key's
        record `key_record` still there (touched with `touch`, as the key's verification touches it), and
        `namespace` (given one). None, with nothing published, when either is gone. Only where `checks_keys`."""
        validate_names(channel, event)
        encoded, ts = encode_data(data), utc_millis()
        call = self._script_call([(channel, event, encoded)], ts, None)
        ids = self._publish_while_key(
            keys=[*call["keys"], key_record, Keys.namespaces()], args=[*call["args"], *touch, namespace or ""]
        )
        if ids is None:
            return None
        (event_id,) = self._published([(channel, event, encoded)], list(ids), ts, None)
        return Event(event_id, channel, event, encoded, ts)

    def publish_many(
        self, events: list[tuple[str, str, object]], sender: str | None = None, sender_is_admin: bool = False
    ) -> list[str]:
        """Publish (channel, event, data) triples all together or not at all; their ids, in order.

        Every event is checked before anything is written, so a refused batch writes nothing (and counts
        nothing against the publish limit, which counts each of its events). On one
        Redis the batch is then one atomic step. On a cluster an atomic step cannot span hash slots: the
        events of each slot (all of a channel's) are one atomic step, in batch order; if Redis fails
        between two steps the answer is 503 with the first steps published (a retry may publish those
        twice: at least once). A batch whose channels share a slot stays one step.
        """
        for channel, event, _ in events:
            validate_names(channel, event)
        checked = [(channel, event, encode_data(data)) for channel, event, data in events]
        self._count_against_limit(sender, sender_is_admin, len(checked))
        return self._append(checked, utc_millis(), sender)

    def _count_against_limit(self, sender: str | None, sender_is_admin: bool, count: int) -> None:
        """Count a user's events once they are otherwise accepted: what is refused never counts."""
        if sender is not None and not sender_is_admin and self.publish_limit is not None:
            self.publish_limit.take(sender, count)

    def _append(self, events: list[tuple[str, str, str]], ts: str, sender: str | None = None) -> list[str]:
        """Run the publish script for (channel, event, encoded data) triples; their ids, in order."""
        if self.cluster:
            ids = self._append_on_cluster(events, ts, sender)
        elif self.replicated:
            (ids,) = self._run_on_node(self.client, [events], ts, sender)
        else:
            ids = list(self._publish_shared(**self._script_call(events, ts, sender)))
        return self._published(events, ids, ts, sender)

    def _published(self, events: list[tuple[str, str, str]], ids: list[str], ts: str, sender: str | None) -> list[str]:
        """After the publish script: counted, and fed to the outgoing webhooks (on a cluster); their ids."""
        EVENTS_PUBLISHED.inc(len(ids))
        self._feed_outgoing([Event(i, c, e, d, ts, sender) for i, (c, e, d) in zip(ids, events, strict=True)])
        return ids

    def _script_call(self, events: list[tuple[str, str, str]], ts: str, sender: str | None) -> dict:
        """KEYS and ARGV of PUBLISH_LUA for events of one hash slot."""
        keys = [Keys.stream(channel) for channel, _, _ in events]
        if not self.cluster:  # the feed is fed in the same step (see _feed_outgoing)
            keys += [Keys.outgoing_endpoints(), Keys.outgoing_feed()]
        args = [
            "SPUBLISH" if self.cluster else "PUBLISH",
            self.history_maxlen,
            ts,
            len(events),
            self.history_ttl * 1000,
        ]
        for channel, event, data in events:
            args += [wake_channel(channel), event, data, channel, sender or ""]
        return {"keys": keys, "args": args}

    def _run_on_node(self, node_client: redis.Redis, groups: list[list], ts: str, sender: str | None) -> list:
        """One pipeline on one node: the script per group, then (replicated) WAIT on the same connection.

        Returns each group's ids or, on a cluster, the error that says its slot is served elsewhere now
        (MOVED, or READONLY from a primary turned replica: the script did not run, the caller places the
        group again). 503 when no replica confirmed what was stored in time (WAIT answering 0, or an error
        such as the node turning replica meanwhile).
        """
        pipe = node_client.pipeline(transaction=False)
        for group in groups:
            self._publish(**self._script_call(group, ts, sender), client=pipe)
        if self.replicated:
            pipe.execute_command("WAIT", 1, REPLICA_WAIT_MILLISECONDS)
        results = pipe.execute(raise_on_error=False)
        acknowledged = results.pop() if self.replicated else None
        elsewhere = PLACED_ELSEWHERE if self.cluster else ()
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, elsewhere):
                raise result
        stored = any(not isinstance(result, Exception) for result in results)
        if stored and self.replicated and (isinstance(acknowledged, Exception) or int(acknowledged) < 1):
            raise NotReplicated()
        return [result if isinstance(result, Exception) else list(result) for result in results]

    def _append_on_cluster(self, events: list[tuple[str, str, str]], ts: str, sender: str | None) -> list[str]:
        """One atomic step per hash slot; the steps of one node in one pipeline (and one WAIT)."""
        ids: list[str | None] = [None] * len(events)
        pending = list(range(len(events)))
        for attempt in range(MOVED_RETRIES + 1):
            by_slot: dict[int, list[int]] = defaultdict(list)
            for index in pending:
                by_slot[self.client.keyslot(Keys.stream(events[index][0]))].append(index)
            by_node: dict[str, tuple] = {}
            for positions in by_slot.values():
                node = self.client.get_node_from_key(Keys.stream(events[positions[0]][0]))
                by_node.setdefault(node.name, (node, []))[1].append(positions)
            pending = []
            for node, groups in by_node.values():
                try:
                    results = self._run_on_node(
                        self.client.get_redis_connection(node), [[events[i] for i in g] for g in groups], ts, sender
                    )
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    self._refresh_topology()  # the node is gone: the next publication asks the new one
                    raise
                for positions, result in zip(groups, results, strict=True):
                    if isinstance(result, Exception):
                        moved = result
                        pending += positions
                    else:
                        for index, event_id in zip(positions, result, strict=True):
                            ids[index] = event_id
            if not pending:
                return ids
            if attempt < MOVED_RETRIES:
                self._refresh_topology()
        raise moved

    def _refresh_topology(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisClusterException):  # no node reachable: the error says so
            self.client.nodes_manager.initialize()

    def _feed_outgoing(self, events: list[Event]) -> None:
        """Hand published events to the outgoing webhooks' dispatcher (feed `outgoing:feed`).

        On one Redis the publish script did it in the same atomic step. On a cluster the feed lives in
        another hash slot, so it is a second step here, before the answer: if Redis fails here the
        publication answers 503 although its events are published (a retry may publish them twice: at
        least once for acknowledged events).
        """
        if self.cluster:
            feed_events(self.client, events, replicated=self.replicated)

    def announce_sessions_ended(self, user_id: str, session_ids: list[str], whole_user: bool = False) -> None:
        """Tell every worker of every instance to close these sessions' connections."""
        message = json.dumps({"user_id": user_id, "session_ids": session_ids, "whole_user": whole_user})
        if self.cluster:
            self.client.spublish(CONTROL_CHANNEL, message)
        else:
            self.client.publish(CONTROL_CHANNEL, message)

    def announce_access_changed(
        self, reason: str, *, channel: str | None = None, namespace: str | None = None, user_id: str | None = None
    ) -> None:
        """Tell every worker of every instance that access to channels changed; they re-check or end it.

        One user's grant of one channel (`channel`, `user_id`; `user_id` None: every subscriber of the
        channel, as for an organization's channels): on the channel's own wake-up channel, the
        path its events take, so the change is in order with them: nothing published after a revocation
        reaches the user. A namespace's rules or existence (`namespace`): on the control channel.
        `reason`: revoked, access_changed (grants and rules: re-check) or namespace_deleted.
        """
        if channel is not None:
            target = wake_channel(channel)
            message = json.dumps({"control": {"reason": reason, "channel": channel, "user_id": user_id}})
        else:
            target = CONTROL_CHANNEL
            message = json.dumps({"access": {"reason": reason, "namespace": namespace}})
        if self.cluster:
            self.client.spublish(target, message)
        else:
            self.client.publish(target, message)

    def announce_org_changed(self, org_id: str, user_id: str | None = None) -> None:
        """Tell every worker of every instance that membership of an organization changed: one user's
        (`user_id`: removed, left, or a role changed) or everyone's (None: the organization was deleted).
        Their open subscriptions to the organization's channels are checked again (on the control channel)."""
        message = json.dumps({"org": {"org_id": org_id, "user_id": user_id}})
        if self.cluster:
            self.client.spublish(CONTROL_CHANNEL, message)
        else:
            self.client.publish(CONTROL_CHANNEL, message)

    def present(self, channels: list[str]) -> dict[str, str]:
        """The position just after the newest event of each channel (0-0 for a channel never used)."""
        return self.opening([], channels, {}).present

    def opening(
        self, checks: list[ScriptCall], channels: list[str], positions: dict[str, str], reads: list = ()
    ) -> Opening:
        """What a reader reads as it starts, in one round trip shared with other readers starting at the same
        moment: the answers of `checks` (a live connection's lease and session) and of the plain commands
        `reads` (its access to named channels, read after the history of their streams), where each of
        `channels` stands now, the channels of `positions` whose kept history no longer reaches back to their
        position, and the first events after each position (as `read_after`).

        Trimming removes the oldest entries, so events after a position were lost when entries were
        trimmed and the oldest kept entry is after the position. (A position exactly on the newest
        trimmed entry also counts: at worst an unneeded reset, never a silent gap.) A history that expired
        (EVENT_HISTORY_TTL_SECONDS) and was begun again by a later publication counts too: the position is
        before its first entry (`StreamRead.lost_after`). While the channel has no history at all there is
        nothing to read and no reset: a reader opening after the next publication gets it.
        """
        wanted = channels + [channel for channel in positions if channel not in channels]
        checked, streams = self._read_streams(wanted, positions, HISTORY_BATCH, checks, reads)
        trimmed = [channel for channel, at in positions.items() if streams[channel].lost_after(at)]
        events = self._events([(channel, streams[channel].entries) for channel in positions], HISTORY_BATCH)
        return Opening(checked, {channel: streams[channel].last for channel in channels}, trimmed, events)

    def read_after(self, positions: dict[str, str], limit: int = HISTORY_BATCH) -> tuple[list[Event], bool]:
        """Events after each position (up to `limit` per channel), and whether more remain."""
        streams = self._read_streams(list(positions), positions, limit)[1]
        return self._events([(channel, streams[channel].entries) for channel in positions], limit)

    def _read_streams(
        self, channels: list[str], positions: dict[str, str], limit: int, checks: list[ScriptCall] = (), reads=()
    ) -> tuple[list, dict[str, StreamRead]]:
        """The answers of the `checks` scripts and then of the commands `reads`, and of each channel where it
        stands, the oldest id it keeps if it ever dropped any, and up to `limit` events after its position in
        `positions` (none for a channel without one), in one round trip shared with other readers. A lost
        connection and a script's or read's error are raised.

        The entries are read before where each channel stands (and whether it was trimmed): entries trimmed in
        between can only make the trim check answer "trimmed" (a reset the reader did not need), never hide
        a gap. On one Redis, where each channel stands is one script (STREAM_POSITIONS_LUA), beside the checks.
        A cluster's channels live in different hash slots and its pipelines carry no scripts: there the checks
        go first, one round trip each, then XRANGE and XINFO STREAM of each channel in one pipeline. The
        `reads` follow the XRANGEs, on the same connection as each stream's on a cluster (for keys of its slot).
        """
        after = {c: p for c, p in positions.items() if p != LAST_POSSIBLE_ID}  # nothing can follow the last id
        if self.cluster:
            checked = [script(keys=keys, args=args) for script, keys, args in checks]
            streams, read = self._read_streams_apart(channels, after, limit, reads)
            return checked + read, streams
        ranged = [channel for channel in channels if channel in after]
        calls = [*checks, (self._stream_positions, [Keys.stream(channel) for channel in channels], [])]
        answers = self._read(
            [("xrange", (Keys.stream(c), f"({after[c]}", "+"), {"count": limit}) for c in ranged]
            + list(reads)
            + [("evalsha", (script.sha, len(keys), *keys, *args), {}) for script, keys, args in calls]
        )
        cut = len(ranged) + len(reads)
        ranges, read, answers = answers[: len(ranged)], answers[len(ranged) : cut], answers[cut:]
        answers = [
            # after a script flush: the script's own call, which loads it again (EVAL)
            script(keys=keys, args=args) if isinstance(answer, redis.exceptions.NoScriptError) else answer
            for (script, keys, args), answer in zip(calls, answers, strict=True)
        ]
        for answer in ranges + read + answers:
            if isinstance(answer, Exception):
                raise answer
        entries = dict(zip(ranged, ranges, strict=True))
        streams = {
            channel: StreamRead(last, oldest, first, entries.get(channel, []))
            for channel, (last, oldest, first) in zip(channels, answers[-1], strict=True)
        }
        return answers[:-1] + read, streams

    def _read_streams_apart(
        self, channels: list[str], after: dict[str, str], limit: int, reads=()
    ) -> tuple[dict[str, StreamRead], list]:
        """`_read_streams` on a cluster: XRANGE of each channel, the `reads`, then XINFO STREAM of each channel,
        in one pipeline; and the answers of the `reads`."""
        ranged = [channel for channel in channels if channel in after]
        commands = [("xrange", (Keys.stream(c), f"({after[c]}", "+"), {"count": limit}) for c in ranged]
        commands += [*reads, *[("xinfo_stream", (Keys.stream(channel),), {}) for channel in channels]]
        answers = self._read(commands)
        cut = len(ranged) + len(reads)
        ranges, read, infos = answers[: len(ranged)], answers[len(ranged) : cut], answers[cut:]
        for answer in infos:  # XINFO of a stream never written is an error: it stands at 0-0
            if isinstance(answer, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
                raise answer
        for answer in ranges + read:
            if isinstance(answer, Exception):
                raise answer
        entries = dict(zip(ranged, ranges, strict=True))
        streams = {}
        for channel, info in zip(channels, infos, strict=True):
            info = {} if isinstance(info, Exception) else info
            oldest = first = ""
            if int(info.get("entries-added", 0)) > int(info.get("length", 0)):
                oldest = info.get("recorded-first-entry-id") or (info.get("first-entry") or ["0-0"])[0]
            elif info.get("first-entry"):
                first = info["first-entry"][0]
            last = info.get("last-generated-id", NEVER_USED)
            streams[channel] = StreamRead(last, oldest, first, entries.get(channel, []))
        return streams, read

    def _events(self, ranges: list[tuple[str, list]], limit: int) -> tuple[list[Event], bool]:
        events, more, recent = [], False, self.recent
        for channel, entries in ranges:
            events.extend(recent.event(i, channel, f) for i, f in entries)
            more = more or len(entries) == limit
        return events, more

    def session_is_valid(self, caller) -> bool:
        """Re-check a live connection's session (after a reconnect a control message may be lost)."""
        return session_is_valid(caller.user_id, caller.session_id, caller.token_version, self.scripts)

    def session_check(self, caller) -> ScriptCall:
        """The same re-check, as a script call to send with a reader's first reads (`opening`)."""
        keys, args = session_check(caller.user_id, caller.session_id)
        return self.scripts.verify_access_script, keys, args

    @staticmethod
    def held_user(caller, answer) -> dict | None:
        """The user's public fields (with the stored role) from the session check's answer; None unless the
        caller's session is still current."""
        return checked_user(caller.user_id, caller.token_version, answer)
