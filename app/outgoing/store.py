"""Outgoing endpoints and their messages in Redis.

Every Lua step touches the keys of one hash slot only, all passed in KEYS, so the same code runs on one
Redis and on a Redis Cluster. An endpoint's keys (record, queue, messages, pending set, retry schedule,
attempts) share the tag `{<endpoint id>}`, so everything that happens to its messages is one atomic step.
The few global keys (the set of endpoint ids, the change counter, the feed of published events, the
heartbeats) are changed as separate steps, in an order that leaves nothing wrong if a process dies
between two of them:

- creating an endpoint writes its record (and queue) first, then adds its id to the set, then bumps the
  counter; deleting removes the record (and everything under its tag) first, then the id, then bumps.
  An id whose record is missing is an interrupted deletion and counts as gone (delivery prunes it);
  a record whose id never reached the set belongs to a creation that was never answered and is unseen;
- a change, rotation or disabling writes the record, then bumps the counter; attempts read the record
  itself (same slot as the message), so a change applies at once even if the bump never happened, and
  delivery processes also reload every endpoint now and then;
- dispatching an event creates its messages (one step per endpoint), and only then acknowledges the feed
  entry: a process that dies between them leaves the entry pending, another one claims it and creates
  nothing twice, because a message is created at most once per (endpoint, event): its id is derived
  from both, so a dispatcher that runs an event twice (after a crash) or a replay of an event already
  sent reuses the same message and the same `webhook-id`.

A message is `pending` from creation until an attempt succeeds (`delivered`) or the retry schedule runs
out (`failed`); while pending it is either in its endpoint's queue (a stream read by a consumer group)
or in its endpoint's retry schedule, scored by when it is next due.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from ..channels.patterns import covers
from ..http import rfc3339
from ..redis import Keys, is_cluster
from .replicas import execute_replicated

DELIVER_GROUP = "deliver"
DISPATCH_GROUP = "dispatch"
WAKE_CHANNEL = "outgoing:wake"  # pub/sub: "a queue has new entries", so readers need not poll
RECENT_MESSAGES = 1000  # per endpoint, in its list of messages
ATTEMPTS_KEPT = 50  # per message
ENQUEUE_BATCH = 100  # messages per enqueue step
ENDPOINT_ID = re.compile(r"ep_[0-9a-f]{32}")
MESSAGE_ID = re.compile(r"msg_[a-z2-7]{26}")
STATUSES = ("pending", "delivered", "failed")

# KEYS: endpoint, queue. ARGV: group, then the record's field/value pairs. The record, its queue and
# the queue's consumer group come into being together (the id joins the set of endpoints afterwards).
CREATE_ENDPOINT = """
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
return 1
"""

# KEYS: endpoint. ARGV: field/value pairs. 0 when the endpoint does not exist (any more).
UPDATE_ENDPOINT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

# KEYS: endpoint. ARGV: new secret, now, overlap. The current secret keeps signing until now + overlap;
# a secret older than that one is dropped.
ROTATE_SIGNING = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local current = redis.call('HGET', KEYS[1], 'secret')
redis.call('HSET', KEYS[1], 'previous_secret', current,
           'previous_secret_until', tonumber(ARGV[2]) + tonumber(ARGV[3]), 'secret', ARGV[1])
return 1
"""

# KEYS: endpoint, queue, messages, pending, retries. The queue and the retry schedule go with the
# endpoint, so nothing queued or scheduled is sent; messages and attempts expire on their own.
DELETE_ENDPOINT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return 1
"""

# KEYS: endpoint, queue, messages, pending, retries, then one message key per message. ARGV: now, ttl,
# recent-list length, force ('1': send an existing message again), endpoint id, then per message:
# message id, event id, channel, event name, body (5 each). Creates each message the (enabled) endpoint
# does not have yet, or, forced, queues it again with a fresh schedule. How many were queued.
ENQUEUE = """
if redis.call('HGET', KEYS[1], 'disabled') ~= '0' then return 0 end
local now, ttl, keep, force, ep_id = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4] == '1', ARGV[5]
local queued = 0
for i = 6, #KEYS do
  local msg, a = KEYS[i], 6 + (i - 6) * 5
  local msg_id = ARGV[a]
  local exists = redis.call('EXISTS', msg) == 1
  if not exists then
    redis.call('HSET', msg, 'id', msg_id, 'endpoint_id', ep_id, 'event_id', ARGV[a + 1],
               'channel', ARGV[a + 2], 'event', ARGV[a + 3], 'body', ARGV[a + 4], 'status', 'pending',
               'created_at', now, 'next_attempt_at', now, 'failures', 0)
    redis.call('ZADD', KEYS[3], now, msg_id)
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -keep - 1)
  elseif force then
    redis.call('ZREM', KEYS[5], msg_id)
    redis.call('HSET', msg, 'status', 'pending', 'next_attempt_at', now, 'failures', 0)
  end
  if force or not exists then
    redis.call('EXPIRE', msg, ttl)
    redis.call('ZADD', KEYS[4], 'NX', now, msg_id)
    redis.call('XADD', KEYS[2], '*', 'm', msg_id)
    queued = queued + 1
  end
end
return queued
"""

# KEYS: the feed. ARGV: group, then entry ids. Entries whose messages exist now: acknowledged and gone.
ACK_FEED = """
redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return #ARGV - 1
"""

# KEYS: queue, message, attempts, pending, endpoint, retries. ARGV: group, entry id, attempt (JSON),
# succeeded ('1'/'0'), now, disable after (s), ttl, attempts kept, then the retry schedule (seconds
# after the 1st, 2nd ... failure). The attempt, the message's next state (and its place in the retry
# schedule), the endpoint's failing streak and the queue entry's acknowledgement change together.
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
local delay = tonumber(ARGV[8 + failures])
local outcome = 'failed'
if delay and endpoint then
  local due = now + delay
  redis.call('HSET', KEYS[2], 'status', 'pending', 'next_attempt_at', tostring(due))
  redis.call('ZADD', KEYS[6], due, msg_id)
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

# KEYS: retries, endpoint, queue. ARGV: now, limit. Moves the endpoint's retries that are due into its
# queue (the ZREM and the XADD are one step, so each happens once whichever process runs it); then how
# many moved and when the next one is due (false when none is scheduled). A message that expired
# meanwhile is given up by the attempt that finds no record.
RELEASE_DUE = """
local moved = 0
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
  if redis.call('EXISTS', KEYS[2]) == 1 then
    for _, msg_id in ipairs(due) do redis.call('XADD', KEYS[3], '*', 'm', msg_id) end
    moved = #due
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {moved, first[2] or false}
"""

# KEYS: endpoint, queue. ARGV: group. The queue's group, made again after it went missing (a Redis
# restored from an older file), but only for an endpoint that still exists.
ENSURE_GROUP = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
return 1
"""


class ScriptCalls:
    """Script calls sent together: one pipeline, so one round trip per Redis node.

    redis-py's cluster pipeline sends EVALSHA but, unlike its single-node pipeline, never loads a script
    a node lacks (a fresh node, a replica just promoted). A call refused for that did not run, so it is
    run again on its own, which loads the script first. Any other error is raised (the first one) after
    the others ran: every caller's steps are safe to repeat.
    """

    def __init__(self, client, replicated: bool = False):
        self.client = client
        self.replicated = replicated  # each node's calls confirmed by a replica (see replicas.py)
        self.calls: list[tuple] = []

    def add(self, script, keys: list[str], args: list) -> None:
        """Queue one call of a registered script."""
        self.calls.append((script, keys, args))

    def execute(self) -> list:
        """Every call's result, in order."""
        if not self.calls:
            return []
        if self.replicated:
            return self._execute_replicated()
        pipe = self.client.pipeline(transaction=False)
        for script, keys, args in self.calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        results = pipe.execute(raise_on_error=False)
        failure = None
        for index, result in enumerate(results):
            if isinstance(result, redis.exceptions.NoScriptError):
                script, keys, args = self.calls[index]
                results[index] = script(keys=keys, args=args)
            elif isinstance(result, Exception) and failure is None:
                failure = result
        self.calls = []
        if failure is not None:
            raise failure
        return results

    def _execute_replicated(self) -> list:
        """The calls of each node in one pipeline on that node's connection, then its WAIT (the node's own
        pipeline loads missing scripts itself)."""
        by_node: dict[str, list[int]] = {}
        for index, (_, keys, _) in enumerate(self.calls):
            node = self.client.get_node_from_key(keys[0]).name if is_cluster(self.client) else ""
            by_node.setdefault(node, []).append(index)
        results: list = [None] * len(self.calls)
        for indexes in by_node.values():

            def queue(pipe, indexes=indexes):
                for index in indexes:
                    script, keys, args = self.calls[index]
                    script(keys=keys, args=args, client=pipe)

            for index, result in zip(indexes, execute_replicated(self.client, self.calls[indexes[0]][1][0], queue),
                                     strict=True):  # fmt: skip
                results[index] = result
        self.calls = []
        return results


def new_endpoint_id() -> str:
    """`ep_` and 128 random bits."""
    return "ep_" + uuid.uuid4().hex


def message_id(endpoint_id: str, channel: str, event_id: str) -> str:
    """The id of the message that carries one event to one endpoint (also its `webhook-id`)."""
    digest = hashlib.sha256(f"{endpoint_id}\n{channel}\n{event_id}".encode()).digest()
    return "msg_" + base64.b32encode(digest).decode().lower()[:26]


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
        if not any(covers(wanted, channel) for wanted in self.channels):
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
    """Endpoints, messages and their transitions, over one Redis client (one Redis or a cluster)."""

    def __init__(self, client: redis.Redis, settings, replicated: bool = False):
        self.client = client
        self.settings = settings  # OutgoingWebhooks
        # EVENT_DURABILITY=replicated: a message made from an acknowledged event is on a replica before
        # its feed entry is acknowledged, and a manual retry or replay before it is answered.
        self.replicated = replicated
        self._create = client.register_script(CREATE_ENDPOINT)
        self._update = client.register_script(UPDATE_ENDPOINT)
        self._rotate = client.register_script(ROTATE_SIGNING)
        self._delete = client.register_script(DELETE_ENDPOINT)
        self._enqueue = client.register_script(ENQUEUE)
        self._ack_feed = client.register_script(ACK_FEED)
        self._record = client.register_script(RECORD_ATTEMPT)
        self._give_up = client.register_script(GIVE_UP)
        self._release_due = client.register_script(RELEASE_DUE)
        self._ensure_group = client.register_script(ENSURE_GROUP)

    # Endpoints

    def create_endpoint(self, url: str, channels: list[str], events: list[str] | None, description: str | None):
        """A new endpoint; its record W and its secret (shown this once).

        Record and queue first, then the id in the set, then the bump (see the module docstring).
        """
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
            keys=[Keys.outgoing_endpoint(endpoint_id), Keys.outgoing_queue(endpoint_id)],
            args=[DELIVER_GROUP] + [item for pair in record.items() for item in pair],
        )
        self.client.sadd(Keys.outgoing_endpoints(), endpoint_id)
        self._bump()
        return public_endpoint(record), secret

    def endpoint_record(self, endpoint_id: str) -> dict | None:
        """The stored hash of one endpoint, or None."""
        if not ENDPOINT_ID.fullmatch(endpoint_id):
            return None
        return self.client.hgetall(Keys.outgoing_endpoint(endpoint_id)) or None

    def list_endpoints(self) -> list[dict]:
        """Every endpoint's stored hash, oldest first."""
        return [record for _, record in self._endpoint_records() if record]

    def _endpoint_records(self) -> list[tuple[str, dict | None]]:
        """(id, record or None) for every id in the set; None: a deletion interrupted half-way."""
        ids = sorted(self.client.smembers(Keys.outgoing_endpoints()))
        pipe = self.client.pipeline(transaction=False)
        for endpoint_id in ids:
            pipe.hgetall(Keys.outgoing_endpoint(endpoint_id))
        found = [(endpoint_id, record or None) for endpoint_id, record in zip(ids, pipe.execute(), strict=True)]
        present = sorted((pair for pair in found if pair[1]), key=lambda pair: float(pair[1]["created_at"]))
        return present + [pair for pair in found if not pair[1]]

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
                keys=[Keys.outgoing_endpoint(endpoint_id)], args=[item for pair in fields.items() for item in pair]
            )
            if not done:
                return None
            self._bump()
        return self.endpoint_record(endpoint_id)

    def rotate_secret(self, endpoint_id: str) -> str | None:
        """A new current secret; the old one keeps signing for the overlap. None when there is no endpoint."""
        from .signing import new_secret

        secret = new_secret()
        done = self._rotate(
            keys=[Keys.outgoing_endpoint(endpoint_id)],
            args=[secret, f"{time.time():.3f}", self.settings.secret_overlap_seconds],
        )
        if not done:
            return None
        self._bump()
        return secret

    def delete_endpoint(self, endpoint_id: str) -> bool:
        """Delete an endpoint, its queue and its retries, then its id; False when there was none.

        A deletion interrupted after the first step is completed by the next one (or by delivery's pruning).
        """
        removed = self._delete(
            keys=[
                Keys.outgoing_endpoint(endpoint_id),
                Keys.outgoing_queue(endpoint_id),
                Keys.outgoing_messages(endpoint_id),
                Keys.outgoing_pending(endpoint_id),
                Keys.outgoing_retries(endpoint_id),
            ]
        )
        unlisted = self.client.srem(Keys.outgoing_endpoints(), endpoint_id)
        if removed or unlisted:
            self._bump()
        return bool(removed or unlisted)

    def _bump(self) -> None:
        self.client.incr(Keys.outgoing_endpoints_version())

    def endpoints_version(self) -> str:
        """The counter every endpoint change bumps."""
        return self.client.get(Keys.outgoing_endpoints_version()) or "0"

    def load_endpoints(self) -> list[Endpoint]:
        """Every endpoint, for matching and delivery; ids left by interrupted deletions are pruned."""
        pairs = self._endpoint_records()
        dangling = [endpoint_id for endpoint_id, record in pairs if record is None]
        if dangling:
            # The record goes before the id, and a creation writes the record before the id: an id
            # without a record is never one being created.
            self.client.srem(Keys.outgoing_endpoints(), *dangling)
        return [Endpoint.from_record(record) for _, record in pairs if record]

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

    def add_enqueue(self, calls: ScriptCalls, endpoint_id: str, items: list[tuple[str, str, str, str]], force: bool):
        """Queue on `calls` the steps that make (or, forced, queue again) one endpoint's messages for
        (event id, channel, event name, body) items; see ENQUEUE. Each step's result: how many were queued."""
        head = [
            Keys.outgoing_endpoint(endpoint_id),
            Keys.outgoing_queue(endpoint_id),
            Keys.outgoing_messages(endpoint_id),
            Keys.outgoing_pending(endpoint_id),
            Keys.outgoing_retries(endpoint_id),
        ]
        common = [f"{time.time():.3f}", self.settings.retention_seconds, RECENT_MESSAGES, "1" if force else "0"]
        for start in range(0, len(items), ENQUEUE_BATCH):
            keys, args = list(head), [*common, endpoint_id]
            for event_id, channel, event, body in items[start : start + ENQUEUE_BATCH]:
                msg_id = message_id(endpoint_id, channel, event_id)
                keys.append(Keys.outgoing_message(endpoint_id, msg_id))
                args += [msg_id, event_id, channel, event, body]
            calls.add(self._enqueue, keys, args)

    def enqueue(self, endpoint_id: str, items: list[tuple[str, str, str, str]], force: bool) -> int:
        """Make (or, forced, queue again) one endpoint's messages; how many were queued."""
        calls = ScriptCalls(self.client, self.replicated)
        self.add_enqueue(calls, endpoint_id, items, force)
        queued = sum(calls.execute())
        if queued:
            self.wake()
        return queued

    def dispatch(self, matches: dict[str, list[tuple[str, str, str, str]]], feed_entries: list[str]) -> int:
        """Make the messages matched from a batch of feed entries, then acknowledge the entries.

        Two steps, in this order: an entry is acknowledged only once its messages exist, so a process
        dying in between leaves it pending for another one, whose enqueue finds them made already.
        """
        calls = ScriptCalls(self.client, self.replicated)
        for endpoint_id, items in matches.items():
            self.add_enqueue(calls, endpoint_id, items, force=False)
        created = sum(calls.execute())
        if created:
            self.wake()
        if feed_entries:
            self._ack_feed(keys=[Keys.outgoing_feed()], args=[DISPATCH_GROUP, *feed_entries])
        return created

    def wake(self) -> None:
        """Tell every delivery process's reader that a queue has new entries.

        Only a hint (readers look at their queues every second anyway): a node that cannot take it now
        (a cluster failing over) must not fail the step it follows.
        """
        with contextlib.suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            self.client.publish(WAKE_CHANNEL, "")

    def retry_message(self, endpoint_id: str, record: dict) -> int:
        """Send a message again now, with a fresh retry schedule (its webhook-id stays)."""
        return self.enqueue(
            endpoint_id, [(record["event_id"], record["channel"], record["event"], record["body"])], force=True
        )

    def record_attempt(
        self, endpoint_id: str, msg_id: str, entry_id: str, attempt: dict, succeeded: bool, disable_after=None
    ) -> str:
        """Store an attempt's outcome and the message's next state; acknowledge its queue entry. An endpoint
        failing for `disable_after` seconds (default WEBHOOK_OUT_DISABLE_AFTER_SECONDS) is disabled."""
        outcome = self._record(
            keys=[
                Keys.outgoing_queue(endpoint_id),
                Keys.outgoing_message(endpoint_id, msg_id),
                Keys.outgoing_attempts(endpoint_id, msg_id),
                Keys.outgoing_pending(endpoint_id),
                Keys.outgoing_endpoint(endpoint_id),
                Keys.outgoing_retries(endpoint_id),
            ],
            args=[
                DELIVER_GROUP,
                entry_id,
                json.dumps(attempt, separators=(",", ":")),
                "1" if succeeded else "0",
                f"{time.time():.3f}",
                self.settings.disable_after_seconds if disable_after is None else disable_after,
                self.settings.retention_seconds,
                ATTEMPTS_KEPT,
                *self.settings.retry_schedule,
            ],
        )
        if outcome.endswith(":disabled"):
            self._bump()  # the record says disabled already; the bump only tells copies elsewhere
        return outcome

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

    def release_due_retries(self, endpoint_ids: list[str], now: float, limit: int = 200) -> tuple[int, float | None]:
        """Move the retries that are due into their endpoints' queues (one step per endpoint, all in one
        round trip per node); how many moved, and when the next one is due (None: none scheduled)."""
        calls = ScriptCalls(self.client)  # a release lost in a failover is released again
        for endpoint_id in endpoint_ids:
            keys = [
                Keys.outgoing_retries(endpoint_id),
                Keys.outgoing_endpoint(endpoint_id),
                Keys.outgoing_queue(endpoint_id),
            ]
            calls.add(self._release_due, keys, [f"{now:.3f}", limit])
        moved, upcoming = 0, None
        for count, first in calls.execute():
            moved += count
            if first is not None:
                upcoming = float(first) if upcoming is None else min(upcoming, float(first))
        if moved:
            self.wake()
        return moved, upcoming

    def migrate_legacy_retries(self, limit: int = 500) -> int:
        """Move retries scheduled by an earlier version (one global set) into their endpoints' schedules.

        Copy, then remove: a process dying between them leaves a copy that the next run adds again (NX).
        """
        legacy = Keys.outgoing_legacy_retries()
        found = self.client.zrange(legacy, 0, limit - 1, withscores=True)
        if not found:
            return 0
        retries = []
        for member, due in found:
            endpoint_id, _, msg_id = member.partition("\n")
            if ENDPOINT_ID.fullmatch(endpoint_id) and MESSAGE_ID.fullmatch(msg_id):
                retries.append((endpoint_id, msg_id, due))
        pipe = self.client.pipeline(transaction=False)
        for endpoint_id, _, _ in retries:
            pipe.exists(Keys.outgoing_endpoint(endpoint_id))
        alive = pipe.execute() if retries else []
        pipe = self.client.pipeline(transaction=False)
        for (endpoint_id, msg_id, due), exists in zip(retries, alive, strict=True):
            if exists:  # a deleted endpoint's retries are dropped, as they always were
                pipe.zadd(Keys.outgoing_retries(endpoint_id), {msg_id: due}, nx=True)
        pipe.execute()
        self.client.zrem(legacy, *[member for member, _ in found])
        return len(found)

    def ensure_group(self, endpoint_id: str) -> None:
        """Make an existing endpoint's consumer group again if it went missing."""
        try:
            self._ensure_group(
                keys=[Keys.outgoing_endpoint(endpoint_id), Keys.outgoing_queue(endpoint_id)], args=[DELIVER_GROUP]
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
