"""Back-channel logout targets: one client's logout messages, queued and sent by the delivery process.

A target is a queue of messages to one client, kept exactly as an outgoing endpoint's (record, queue with the
`deliver` group, messages, pending set, retry schedule, attempts: `Keys.outgoing_*(target id)`, one hash tag),
so the delivery process reads, retries, claims, bounds and records its messages with the steps it uses for
webhooks: a slow client only ever occupies its own slots. A target is never in the set of webhook endpoints
(matching, the admin API and the backlog never see it); its id is in a set of its own. What an attempt sends
is not stored: the kind's builder (registered by the OpenID provider, app/oidc/backchannel.py) makes it at each
attempt, a form with a logout token signed at that moment, to the URI the client has then.

Queueing is one Lua step per target: its record and queue are made when missing, and each message is made at
most once (its id derives from the target and the session), so a session whose end is noticed twice is told
once. The id joins the set after that step, as an endpoint's does after its creation. A target whose client is
gone, with nothing pending and nothing queued for an hour, is deleted by the delivery process (record first,
then the id).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from dataclasses import dataclass

import redis
from prometheus_client import Counter

from ..redis import Keys
from .store import DELIVER_GROUP, RECENT_MESSAGES, WAKE_CHANNEL, Endpoint, message_id

KIND = "backchannel"
CHANNEL, EVENT = "backchannel-logout", "logout"  # what a target's message records as its channel and event
TARGET_ID = re.compile(r"bc_[0-9a-f]{32}")
NEVER_DISABLED = 100 * 365 * 24 * 3600  # a client's logouts are never switched off by failures
PRUNE_AFTER_SECONDS = 3600  # a gone client's target stays this long after its last message was queued
QUEUE_BATCH = 100

# Counted where they happen: `queued` by the process that noticed a session's end, the rest by the delivery process.
BACKCHANNEL_LOGOUTS = Counter(
    "rt_backchannel_logouts_total",
    "Back-channel logout messages by what became of them (queued, delivered, failed).",
    ["outcome"],
)
BACKCHANNEL_ATTEMPTS = Counter(
    "rt_backchannel_attempts_total",
    "Back-channel logout attempts by result (success, http_error, redirect, timeout, refused, connection_error, "
    "unsendable).",
    ["result"],
)

# KEYS: target, queue. ARGV: group, target id, client id, now. The target's record, queue and group, made
# when the target does not exist; 1 when it was made.
ENSURE_TARGET = """
local function ensure_target()
  if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
  redis.call('HSET', KEYS[1], 'id', ARGV[2], 'kind', 'backchannel', 'client_id', ARGV[3], 'url', '',
             'deleted_at', '', 'channels', '[]', 'events', '', 'description', '', 'disabled', '0',
             'created_at', ARGV[4], 'secret', '', 'previous_secret', '', 'previous_secret_until', '0',
             'failing_since', '', 'last_queued_at', ARGV[4])
  redis.pcall('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
  return 1
end
"""

# KEYS: target, queue, messages, pending, then one message key per message. ARGV: group, target id, client
# id, now, ttl, recent-list length, then per message: message id, session id, body (3 each). {queued, made}.
QUEUE_LOGOUTS = (
    ENSURE_TARGET
    + """
local made = ensure_target()
local now, ttl, keep = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 'last_queued_at', now)
local queued = 0
for i = 5, #KEYS do
  local msg, a = KEYS[i], 7 + (i - 5) * 3
  if redis.call('EXISTS', msg) == 0 then
    redis.call('HSET', msg, 'id', ARGV[a], 'endpoint_id', ARGV[2], 'event_id', ARGV[a + 1], 'channel',
               'backchannel-logout', 'event', 'logout', 'body', ARGV[a + 2], 'status', 'pending',
               'created_at', now, 'next_attempt_at', now, 'failures', 0)
    redis.call('EXPIRE', msg, ttl)
    redis.call('ZADD', KEYS[3], now, ARGV[a])
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -keep - 1)
    redis.call('ZADD', KEYS[4], 'NX', now, ARGV[a])
    redis.call('XADD', KEYS[2], '*', 'm', ARGV[a])
    queued = queued + 1
  end
end
return {queued, made}
"""
)

# KEYS: target, queue. ARGV: group, target id, client id, now, the URI the client had. The client is gone:
# its last URI is kept for the messages still to send ('' when it had none: they are dropped). {made}.
MARK_DELETED = (
    ENSURE_TARGET
    + """
local made = ensure_target()
redis.call('HSET', KEYS[1], 'url', ARGV[5], 'deleted_at', ARGV[4])
return made
"""
)

# KEYS: target, queue, messages, pending, retries. ARGV: queued before. Deletes a (gone client's) target with
# nothing pending whose last message was queued before then; 1 when it is gone (or was already).
PRUNE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 1 end
if tonumber(redis.call('HGET', KEYS[1], 'last_queued_at') or '0') > tonumber(ARGV[1]) then return 0 end
if redis.call('ZCARD', KEYS[4]) > 0 or redis.call('ZCARD', KEYS[5]) > 0 then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return 1
"""


def target_id(client_id: str) -> str:
    """The id of a client's target: `bc_` and 128 bits of its id's SHA-256 (a stable hash tag)."""
    return "bc_" + hashlib.sha256(client_id.encode()).hexdigest()[:32]


def is_target(record: dict) -> bool:
    """Whether an endpoint-shaped record is a back-channel target."""
    return record.get("kind") == KIND


@dataclass(frozen=True)
class Outgoing:
    """What one attempt sends: a POST of `body` with `headers` to `url`."""

    url: str
    body: bytes
    headers: dict[str, str]


class NotSendable(Exception):
    """This attempt cannot be made now (e.g. no signing key opens): recorded as a failed attempt and retried."""


class Targets:
    """The back-channel targets over one Redis client (one Redis or a cluster)."""

    def __init__(self, client: redis.Redis, settings):
        self.client = client
        self.settings = settings  # OutgoingWebhooks: retention and retry schedule apply as to webhooks
        self._queue = client.register_script(QUEUE_LOGOUTS)
        self._mark_deleted = client.register_script(MARK_DELETED)
        self._prune = client.register_script(PRUNE)

    def queue(self, client_id: str, items: list[tuple[str, str]]) -> int:
        """Queue messages for a client's sessions, (session id, body) each, each at most once; how many were new."""
        target = target_id(client_id)
        queued = made = 0
        for start in range(0, len(items), QUEUE_BATCH):
            keys = self._target_keys(target)[:4]
            args = [DELIVER_GROUP, target, client_id, f"{time.time():.3f}", self.settings.retention_seconds]
            args.append(RECENT_MESSAGES)
            for session_id, body in items[start : start + QUEUE_BATCH]:
                msg_id = message_id(target, CHANNEL, session_id)
                keys.append(Keys.outgoing_message(target, msg_id))
                args += [msg_id, session_id, body]
            count, new = self._queue(keys=keys, args=args)
            queued, made = queued + count, made or new
        self._listed(target, made)
        if queued:
            BACKCHANNEL_LOGOUTS.labels("queued").inc(queued)
            self._wake()
        return queued

    def mark_deleted(self, client_id: str, url: str | None) -> None:
        """Keep a deleted client's last back-channel URI (None: it had none) for the messages still to send."""
        target = target_id(client_id)
        made = self._mark_deleted(
            keys=self._target_keys(target)[:2],
            args=[DELIVER_GROUP, target, client_id, f"{time.time():.3f}", url or ""],
        )
        self._listed(target, made)

    def record(self, client_id: str) -> dict:
        """A client's target as stored ({} when there is none)."""
        return self.client.hgetall(Keys.outgoing_endpoint(target_id(client_id)))

    def load(self) -> list[Endpoint]:
        """Every target, as the delivery process holds endpoints (ids whose record is missing are skipped)."""
        ids = sorted(self.client.smembers(Keys.backchannel_targets()))
        pipe = self.client.pipeline(transaction=False)
        for target in ids:
            pipe.hgetall(Keys.outgoing_endpoint(target))
        return [Endpoint.from_record(record) for record in (pipe.execute() if ids else []) if is_target(record)]

    def prune(self, now: float) -> int:
        """Delete the targets of clients that are gone, once nothing of theirs is pending; how many went."""
        ids = sorted(self.client.smembers(Keys.backchannel_targets()))
        if not ids:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for target in ids:
            pipe.hget(Keys.outgoing_endpoint(target), "client_id")
        owners = pipe.execute()
        known = [owner for owner in owners if owner]
        present = self.client.hmget(Keys.oauth_clients(), known) if known else []
        alive = {owner for owner, stored in zip(known, present, strict=True) if stored}
        gone = 0
        for target, owner in zip(ids, owners, strict=True):
            if owner in alive:
                continue
            if self._prune(keys=self._target_keys(target), args=[f"{now - PRUNE_AFTER_SECONDS:.3f}"]):
                self.client.srem(Keys.backchannel_targets(), target)
                gone += 1
        return gone

    def _listed(self, target: str, made: int) -> None:
        """The target's id in the set (every time: cheap, and it heals an interrupted step); a new target also
        bumps the endpoints' counter, so delivery processes read its queue at once."""
        self.client.sadd(Keys.backchannel_targets(), target)
        if made:
            self.client.incr(Keys.outgoing_endpoints_version())

    def _wake(self) -> None:
        # Only a hint: readers look at their queues every second anyway.
        with contextlib.suppress(redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            self.client.publish(WAKE_CHANNEL, "")

    @staticmethod
    def _target_keys(target: str) -> list[str]:
        return [
            Keys.outgoing_endpoint(target),
            Keys.outgoing_queue(target),
            Keys.outgoing_messages(target),
            Keys.outgoing_pending(target),
            Keys.outgoing_retries(target),
        ]
