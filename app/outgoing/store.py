"""Outgoing endpoints and their messages in Redis; every change of state is one Lua step.

A message is created at most once per (endpoint, event): its id is derived from both, so a dispatcher
that runs an event twice (after a crash) or a replay of an event already sent reuses the same
message and the same `webhook-id`. A message is `pending` from creation until an attempt succeeds
(`delivered`) or the retry schedule runs out (`failed`); while pending it is either in its endpoint's
queue (a stream read by a consumer group) or in the retry set, scored by when it is next due.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from ..events.bus import USER_CHANNEL_PREFIX
from ..http import rfc3339
from ..redis import Keys

DELIVER_GROUP = "deliver"
DISPATCH_GROUP = "dispatch"
WAKE_CHANNEL = "outgoing:wake"  # pub/sub: "a queue has new entries", so readers need not poll
RECENT_MESSAGES = 1000  # per endpoint, in its list of messages
ATTEMPTS_KEPT = 50  # per message
ENDPOINT_ID = re.compile(r"ep_[0-9a-f]{32}")
MESSAGE_ID = re.compile(r"msg_[a-z2-7]{26}")
STATUSES = ("pending", "delivered", "failed")

# KEYS: endpoint set, endpoint, queue, version. ARGV: endpoint id, group, then the record's field/value
# pairs. The endpoint, its queue and the queue's consumer group come into being together.
CREATE_ENDPOINT = """
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('SADD', KEYS[1], ARGV[1])
redis.pcall('XGROUP', 'CREATE', KEYS[3], ARGV[2], '0', 'MKSTREAM')
redis.call('INCR', KEYS[4])
return 1
"""

# KEYS: endpoint, version. ARGV: field/value pairs. 0 when the endpoint does not exist (any more).
UPDATE_ENDPOINT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('INCR', KEYS[2])
return 1
"""

# KEYS: endpoint, version. ARGV: new secret, now, overlap. The current secret keeps signing until
# now + overlap; a secret older than that one is dropped.
ROTATE_SIGNING = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local current = redis.call('HGET', KEYS[1], 'secret')
redis.call('HSET', KEYS[1], 'previous_secret', current,
           'previous_secret_until', tonumber(ARGV[2]) + tonumber(ARGV[3]), 'secret', ARGV[1])
redis.call('INCR', KEYS[2])
return 1
"""

# KEYS: endpoint set, endpoint, queue, messages, pending, version. ARGV: endpoint id.
# The queue goes with the endpoint, so nothing queued is sent; scheduled retries find no endpoint and
# are dropped; messages and attempts expire on their own.
DELETE_ENDPOINT = """
if redis.call('SREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('INCR', KEYS[6])
return 1
"""

# KEYS: feed, retries, then per message: endpoint, queue, messages, pending, message (5 each).
# ARGV: dispatch group, feed entry id ('' for none), now, ttl, recent-list length, force ('1': send an
# existing message again), then per message: endpoint id, message id, event id, channel, event name,
# body (6 each). Creates each message its enabled endpoint does not have yet (or, forced, queues it
# again with a fresh schedule), acknowledges the feed entry, and wakes the readers; all or nothing.
ENQUEUE = """
local now, ttl, keep, force = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1'
local queued = 0
for i = 0, (#KEYS - 2) / 5 - 1 do
  local ep, queue, messages, pending, msg = KEYS[3 + i * 5], KEYS[4 + i * 5], KEYS[5 + i * 5],
                                            KEYS[6 + i * 5], KEYS[7 + i * 5]
  local a = 7 + i * 6
  local ep_id, msg_id = ARGV[a], ARGV[a + 1]
  if redis.call('HGET', ep, 'disabled') == '0' then
    local exists = redis.call('EXISTS', msg) == 1
    if not exists then
      redis.call('HSET', msg, 'id', msg_id, 'endpoint_id', ep_id, 'event_id', ARGV[a + 2],
                 'channel', ARGV[a + 3], 'event', ARGV[a + 4], 'body', ARGV[a + 5], 'status', 'pending',
                 'created_at', now, 'next_attempt_at', now, 'failures', 0)
      redis.call('ZADD', messages, now, msg_id)
      redis.call('ZREMRANGEBYRANK', messages, 0, -keep - 1)
    elseif force then
      redis.call('ZREM', KEYS[2], ep_id .. '\\n' .. msg_id)
      redis.call('HSET', msg, 'status', 'pending', 'next_attempt_at', now, 'failures', 0)
    end
    if force or not exists then
      redis.call('EXPIRE', msg, ttl)
      redis.call('ZADD', pending, 'NX', now, msg_id)
      redis.call('XADD', queue, '*', 'm', msg_id)
      queued = queued + 1
    end
  end
end
if ARGV[2] ~= '' then
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
  redis.call('XDEL', KEYS[1], ARGV[2])
end
if queued > 0 then redis.call('PUBLISH', 'outgoing:wake', '') end
return queued
"""

# KEYS: queue, message, attempts, pending, endpoint, retries, version. ARGV: group, entry id, attempt
# (JSON), succeeded ('1'/'0'), now, disable after (s), ttl, attempts kept, retry member, then the
# retry schedule (seconds after the 1st, 2nd ... failure). The attempt, the message's next state, the
# endpoint's failing streak and the queue entry's acknowledgement change together.
RECORD_ATTEMPT = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 0 then return 'gone' end
local now, ttl = tonumber(ARGV[5]), tonumber(ARGV[7])
local msg_id = redis.call('HGET', KEYS[2], 'id')
redis.call('RPUSH', KEYS[3], ARGV[3])
redis.call('LTRIM', KEYS[3], -tonumber(ARGV[8]), -1)
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
local endpoint = redis.call('EXISTS', KEYS[5]) == 1
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], 'status', 'delivered', 'next_attempt_at', '', 'failures', 0)
  redis.call('ZREM', KEYS[4], msg_id)
  if endpoint then redis.call('HSET', KEYS[5], 'failing_since', '') end
  return 'delivered'
end
local failures = redis.call('HINCRBY', KEYS[2], 'failures', 1)
local delay = tonumber(ARGV[9 + failures])
local outcome = 'failed'
if delay and endpoint then
  local due = now + delay
  redis.call('HSET', KEYS[2], 'status', 'pending', 'next_attempt_at', tostring(due))
  redis.call('ZADD', KEYS[6], due, ARGV[9])
  outcome = 'pending'
else
  redis.call('HSET', KEYS[2], 'status', 'failed', 'next_attempt_at', '')
  redis.call('ZREM', KEYS[4], msg_id)
end
if endpoint then
  local since = tonumber(redis.call('HGET', KEYS[5], 'failing_since'))
  if not since then
    redis.call('HSET', KEYS[5], 'failing_since', ARGV[5])
  elseif now - since >= tonumber(ARGV[6]) and redis.call('HGET', KEYS[5], 'disabled') == '0' then
    redis.call('HSET', KEYS[5], 'disabled', '1', 'disabled_at', ARGV[5])
    redis.call('INCR', KEYS[7])
    outcome = outcome .. ':disabled'
  end
end
return outcome
"""

# KEYS: queue, message, pending. ARGV: group, entry id. A message whose endpoint is disabled: `failed`
# without an attempt (a manual retry or a replay sends it once the endpoint is enabled again).
GIVE_UP = """
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'status', 'failed', 'next_attempt_at', '')
redis.call('ZREM', KEYS[3], redis.call('HGET', KEYS[2], 'id'))
return 1
"""

# KEYS: retries, endpoint, queue, message. ARGV: retry member, message id. Moves one due retry into
# its endpoint's queue; the ZREM decides which process does it, so it happens once.
RELEASE_RETRY = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 or redis.call('EXISTS', KEYS[4]) == 0 then return 0 end
redis.call('XADD', KEYS[3], '*', 'm', ARGV[2])
redis.call('PUBLISH', 'outgoing:wake', '')
return 1
"""

# KEYS: endpoint set, queue. ARGV: endpoint id, group. The queue's group, made again after it went
# missing (a Redis restored from an older file), but only for an endpoint that still exists.
ENSURE_GROUP = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0', 'MKSTREAM')
return 1
"""


def new_endpoint_id() -> str:
    """`ep_` and 128 random bits."""
    return "ep_" + uuid.uuid4().hex


def message_id(endpoint_id: str, channel: str, event_id: str) -> str:
    """The id of the message that carries one event to one endpoint (also its `webhook-id`)."""
    digest = hashlib.sha256(f"{endpoint_id}\n{channel}\n{event_id}".encode()).digest()
    return "msg_" + base64.b32encode(digest).decode().lower()[:26]


def retry_member(endpoint_id: str, msg_id: str) -> str:
    """A message's member in the retry set."""
    return f"{endpoint_id}\n{msg_id}"


def event_pattern(pattern: str) -> re.Pattern:
    """An event-name pattern (`order.*`): `*` stands for any run of characters, the rest is literal."""
    return re.compile("^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$")


@dataclass(frozen=True)
class Endpoint:
    """One endpoint as the delivery side needs it."""

    id: str
    url: str
    channels: tuple[str, ...]
    events: tuple[str, ...] | None
    disabled: bool
    secret: str
    previous_secret: str | None
    previous_secret_until: float

    @classmethod
    def from_record(cls, record: dict) -> Endpoint:
        """From the stored hash."""
        events = json.loads(record["events"]) if record.get("events") else None
        return cls(
            record["id"],
            record["url"],
            tuple(json.loads(record["channels"])),
            tuple(events) if events is not None else None,
            record.get("disabled") == "1",
            record["secret"],
            record.get("previous_secret") or None,
            float(record.get("previous_secret_until") or 0),
        )

    def signing_secrets(self, now: float) -> list[str]:
        """The current secret, and the rotated-out one while it still overlaps."""
        if self.previous_secret and now < self.previous_secret_until:
            return [self.secret, self.previous_secret]
        return [self.secret]

    def wants(self, channel: str, event: str) -> bool:
        """Whether an event on `channel` named `event` passes this endpoint's filters."""
        if not any(
            wanted == channel
            or wanted == "*"
            or (wanted == USER_CHANNEL_PREFIX + "*" and channel.startswith(USER_CHANNEL_PREFIX))
            for wanted in self.channels
        ):
            return False
        return self.events is None or any(event_pattern(p).match(event) for p in self.events)


def public_endpoint(record: dict) -> dict:
    """W: what the API shows of an endpoint (never its secret, except once at creation and rotation)."""
    return {
        "id": record["id"],
        "url": record["url"],
        "channels": json.loads(record["channels"]),
        "events": json.loads(record["events"]) if record.get("events") else None,
        "description": record.get("description") or None,
        "disabled": record.get("disabled") == "1",
        "created_at": rfc3339(record["created_at"]),
    }


def _moment(epoch: str | float | None) -> str | None:
    if epoch in (None, ""):
        return None
    return datetime.fromtimestamp(float(epoch), tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def public_message(record: dict, attempts: list[str]) -> dict:
    """M: a message, its attempts and when the next one is due."""
    shown = []
    for raw in attempts:
        attempt = json.loads(raw)
        shown.append({**attempt, "at": _moment(attempt["at"])})
    return {
        "id": record["id"],
        "event_id": record["event_id"],
        "channel": record["channel"],
        "event": record["event"],
        "status": record["status"],
        "created_at": _moment(record["created_at"]),
        "attempts": shown,
        "next_attempt_at": _moment(record.get("next_attempt_at")) if record["status"] == "pending" else None,
    }


class OutgoingStore:
    """Endpoints, messages and their transitions, over one Redis client."""

    def __init__(self, client: redis.Redis, settings):
        self.client = client
        self.settings = settings  # OutgoingWebhooks
        self._create = client.register_script(CREATE_ENDPOINT)
        self._update = client.register_script(UPDATE_ENDPOINT)
        self._rotate = client.register_script(ROTATE_SIGNING)
        self._delete = client.register_script(DELETE_ENDPOINT)
        self._enqueue = client.register_script(ENQUEUE)
        self._record = client.register_script(RECORD_ATTEMPT)
        self._give_up = client.register_script(GIVE_UP)
        self._release = client.register_script(RELEASE_RETRY)
        self._ensure_group = client.register_script(ENSURE_GROUP)

    # Endpoints

    def create_endpoint(self, url: str, channels: list[str], events: list[str] | None, description: str | None):
        """A new endpoint; its record W and its secret (shown this once)."""
        from .signing import new_secret

        endpoint_id, secret = new_endpoint_id(), new_secret()
        record = {
            "id": endpoint_id,
            "url": url,
            "channels": json.dumps(channels),
            "events": json.dumps(events) if events is not None else "",
            "description": description or "",
            "disabled": "0",
            "created_at": f"{time.time():.3f}",
            "secret": secret,
            "previous_secret": "",
            "previous_secret_until": "0",
            "failing_since": "",
        }
        self._create(
            keys=[
                Keys.outgoing_endpoints(),
                Keys.outgoing_endpoint(endpoint_id),
                Keys.outgoing_queue(endpoint_id),
                Keys.outgoing_endpoints_version(),
            ],
            args=[endpoint_id, DELIVER_GROUP] + [item for pair in record.items() for item in pair],
        )
        return public_endpoint(record), secret

    def endpoint_record(self, endpoint_id: str) -> dict | None:
        """The stored hash of one endpoint, or None."""
        if not ENDPOINT_ID.fullmatch(endpoint_id):
            return None
        return self.client.hgetall(Keys.outgoing_endpoint(endpoint_id)) or None

    def list_endpoints(self) -> list[dict]:
        """Every endpoint's stored hash, oldest first."""
        ids = sorted(self.client.smembers(Keys.outgoing_endpoints()))
        pipe = self.client.pipeline(transaction=False)
        for endpoint_id in ids:
            pipe.hgetall(Keys.outgoing_endpoint(endpoint_id))
        records = [record for record in pipe.execute() if record]
        return sorted(records, key=lambda r: float(r["created_at"]))

    def update_endpoint(self, endpoint_id: str, changes: dict) -> dict | None:
        """Apply changes (already checked) at once; the new record, or None when there is none."""
        fields: dict[str, str] = {}
        for name, value in changes.items():
            if name in ("channels",):
                fields[name] = json.dumps(value)
            elif name == "events":
                fields[name] = json.dumps(value) if value is not None else ""
            elif name == "disabled":
                fields[name] = "1" if value else "0"
                if not value:
                    fields["failing_since"] = ""  # enabled again: the failing streak starts over
            else:
                fields[name] = value or ""
        if fields:
            done = self._update(
                keys=[Keys.outgoing_endpoint(endpoint_id), Keys.outgoing_endpoints_version()],
                args=[item for pair in fields.items() for item in pair],
            )
            if not done:
                return None
        return self.endpoint_record(endpoint_id)

    def rotate_secret(self, endpoint_id: str) -> str | None:
        """A new current secret; the old one keeps signing for the overlap. None when there is no endpoint."""
        from .signing import new_secret

        secret = new_secret()
        done = self._rotate(
            keys=[Keys.outgoing_endpoint(endpoint_id), Keys.outgoing_endpoints_version()],
            args=[secret, f"{time.time():.3f}", self.settings.secret_overlap_seconds],
        )
        return secret if done else None

    def delete_endpoint(self, endpoint_id: str) -> bool:
        """Delete an endpoint and its queue; False when there was none."""
        return bool(
            self._delete(
                keys=[
                    Keys.outgoing_endpoints(),
                    Keys.outgoing_endpoint(endpoint_id),
                    Keys.outgoing_queue(endpoint_id),
                    Keys.outgoing_messages(endpoint_id),
                    Keys.outgoing_pending(endpoint_id),
                    Keys.outgoing_endpoints_version(),
                ],
                args=[endpoint_id],
            )
        )

    def endpoints_version(self) -> str:
        """The counter every endpoint change bumps."""
        return self.client.get(Keys.outgoing_endpoints_version()) or "0"

    def load_endpoints(self) -> list[Endpoint]:
        """Every endpoint, for matching and delivery."""
        return [Endpoint.from_record(record) for record in self.list_endpoints()]

    # Messages

    def messages(self, endpoint_id: str, status: str | None, limit: int) -> list[dict]:
        """An endpoint's messages, newest first (pending ones: oldest first), as M."""
        if status == "pending":
            ids = self.client.zrange(Keys.outgoing_pending(endpoint_id), 0, limit - 1)
        else:
            ids = self.client.zrevrange(Keys.outgoing_messages(endpoint_id), 0, RECENT_MESSAGES - 1)
        found = []
        for start in range(0, len(ids), 200):
            pipe = self.client.pipeline(transaction=False)
            chunk = ids[start : start + 200]
            for msg_id in chunk:
                pipe.hgetall(Keys.outgoing_message(endpoint_id, msg_id))
                pipe.lrange(Keys.outgoing_attempts(endpoint_id, msg_id), 0, -1)
            results = pipe.execute()
            for record, attempts in zip(results[::2], results[1::2], strict=True):
                if record and (status is None or record.get("status") == status):
                    found.append(public_message(record, attempts))
            if len(found) >= limit:
                break
        return found[:limit]

    def message_record(self, endpoint_id: str, msg_id: str) -> dict | None:
        """One message's stored hash, or None."""
        if not MESSAGE_ID.fullmatch(msg_id):
            return None
        return self.client.hgetall(Keys.outgoing_message(endpoint_id, msg_id)) or None

    def enqueue(self, items: list[tuple[str, str, str, str, str]], force: bool, feed_entry: str = "", pipe=None):
        """Queue messages for (endpoint id, event id, channel, event name, body) items; see ENQUEUE."""
        keys = [Keys.outgoing_feed(), Keys.outgoing_retries()]
        args = [DISPATCH_GROUP, feed_entry, f"{time.time():.3f}", self.settings.retention_seconds, RECENT_MESSAGES]
        args.append("1" if force else "0")
        for endpoint_id, event_id, channel, event, body in items:
            msg_id = message_id(endpoint_id, channel, event_id)
            keys += [
                Keys.outgoing_endpoint(endpoint_id),
                Keys.outgoing_queue(endpoint_id),
                Keys.outgoing_messages(endpoint_id),
                Keys.outgoing_pending(endpoint_id),
                Keys.outgoing_message(endpoint_id, msg_id),
            ]
            args += [endpoint_id, msg_id, event_id, channel, event, body]
        return self._enqueue(keys=keys, args=args, client=pipe or self.client)

    def retry_message(self, endpoint_id: str, record: dict) -> int:
        """Send a message again now, with a fresh retry schedule (its webhook-id stays)."""
        item = (endpoint_id, record["event_id"], record["channel"], record["event"], record["body"])
        return self.enqueue([item], force=True)

    def record_attempt(self, endpoint_id: str, msg_id: str, entry_id: str, attempt: dict, succeeded: bool) -> str:
        """Store an attempt's outcome and the message's next state; acknowledge its queue entry."""
        return self._record(
            keys=[
                Keys.outgoing_queue(endpoint_id),
                Keys.outgoing_message(endpoint_id, msg_id),
                Keys.outgoing_attempts(endpoint_id, msg_id),
                Keys.outgoing_pending(endpoint_id),
                Keys.outgoing_endpoint(endpoint_id),
                Keys.outgoing_retries(),
                Keys.outgoing_endpoints_version(),
            ],
            args=[
                DELIVER_GROUP,
                entry_id,
                json.dumps(attempt, separators=(",", ":")),
                "1" if succeeded else "0",
                f"{time.time():.3f}",
                self.settings.disable_after_seconds,
                self.settings.retention_seconds,
                ATTEMPTS_KEPT,
                retry_member(endpoint_id, msg_id),
                *self.settings.retry_schedule,
            ],
        )

    def give_up(self, endpoint_id: str, msg_id: str, entry_id: str) -> None:
        """Acknowledge an entry that will not be attempted; its message (if any) is `failed`."""
        self._give_up(
            keys=[
                Keys.outgoing_queue(endpoint_id),
                Keys.outgoing_message(endpoint_id, msg_id),
                Keys.outgoing_pending(endpoint_id),
            ],
            args=[DELIVER_GROUP, entry_id],
        )

    def release_due_retries(self, now: float, limit: int = 200) -> int:
        """Move retries that are due into their endpoints' queues; how many moved."""
        due = self.client.zrangebyscore(Keys.outgoing_retries(), "-inf", now, start=0, num=limit)
        if not due:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for member in due:
            endpoint_id, _, msg_id = member.partition("\n")
            self._release(
                keys=[
                    Keys.outgoing_retries(),
                    Keys.outgoing_endpoint(endpoint_id),
                    Keys.outgoing_queue(endpoint_id),
                    Keys.outgoing_message(endpoint_id, msg_id),
                ],
                args=[member, msg_id],
                client=pipe,
            )
        return sum(pipe.execute())

    def next_retry_due(self) -> float | None:
        """When the earliest scheduled retry is due."""
        first = self.client.zrange(Keys.outgoing_retries(), 0, 0, withscores=True)
        return first[0][1] if first else None

    def ensure_group(self, endpoint_id: str) -> None:
        """Make an existing endpoint's consumer group again if it went missing."""
        try:
            self._ensure_group(
                keys=[Keys.outgoing_endpoints(), Keys.outgoing_queue(endpoint_id)], args=[endpoint_id, DELIVER_GROUP]
            )
        except redis.exceptions.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    def backlog(self) -> tuple[list[tuple[str, int, float | None]], int]:
        """Per endpoint: messages pending and the creation time of the oldest; and the feed's length."""
        ids = sorted(self.client.smembers(Keys.outgoing_endpoints()))
        pipe = self.client.pipeline(transaction=False)
        for endpoint_id in ids:
            pipe.zcard(Keys.outgoing_pending(endpoint_id))
            pipe.zrange(Keys.outgoing_pending(endpoint_id), 0, 0, withscores=True)
        pipe.xlen(Keys.outgoing_feed())
        results = pipe.execute()
        rows = []
        for index, endpoint_id in enumerate(ids):
            count, oldest = results[2 * index], results[2 * index + 1]
            rows.append((endpoint_id, count, oldest[0][1] if oldest else None))
        return rows, results[-1]
