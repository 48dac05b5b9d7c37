"""Deliveries: recorded once (the de-duplication and the log in one Lua step), then published.

Record first, publish after: the answer never waits for publishing, and a delivery whose publishing
fails (or whose worker dies) stays in the pending set, where a sweeper in every worker retries it.
Claiming a pending delivery is a ZREM, so exactly one greenlet anywhere publishes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time

import gevent
import redis

from ..events.bus import CHANNEL_PATTERN, WEBHOOKS, Bus, user_channel
from ..redis import Failures, Keys, redis_error

log = logging.getLogger(__name__)

RETENTION_SECONDS = 8 * 24 * 3600  # longer than the providers' retry windows (Stripe: 3 days)
LOG_LENGTH = 1000
PAYLOAD_IN_EVENT_LIMIT = 60 * 1024  # event data is at most 64 KiB; larger payloads are announced only
SWEEP_INTERVAL, RETRY_DELAY = 2.0, 5.0

# KEYS (all of one provider, so one hash slot): delivery record, provider log, the provider's pending
# set, then any further keys that also identify this delivery (GitHub: its body's hash). ARGV: ttl, log
# length, pending member, now, delivery id, then the record's field/value pairs. 0 if this delivery was
# seen before under any of its keys.
RECORD_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('EXPIRE', KEYS[1], ARGV[1])
for i = 4, #KEYS do redis.call('SET', KEYS[i], ARGV[5], 'EX', ARGV[1]) end
redis.call('LPUSH', KEYS[2], ARGV[5])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return 1
"""
UNSAFE_NAME_CHARACTERS = re.compile(r"[^A-Za-z0-9_.:-]")


def event_name(provider: str, kind: str) -> str:
    """`webhook.<provider>.<type>`, with any character an event name may not hold made `_`."""
    return UNSAFE_NAME_CHARACTERS.sub("_", f"webhook.{provider}.{kind}")[:100]


def user_at_path(payload, path: str | None) -> str | None:
    """The value at a dotted path (e.g. data.object.metadata.user_id), if it names a user."""
    if not path:
        return None
    value = payload
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    value = str(value)
    return value if CHANNEL_PATTERN.fullmatch(user_channel(value)) else None


class DeliveryStore:
    """Received deliveries: recorded once, published after the answer, retried by a sweeper."""

    def __init__(self, client: redis.Redis, bus: Bus, providers: tuple[str, ...] = (), redis_url: str = ""):
        """`redis_url`: where `client` connects (REDIS_URL), for the log lines of an outage."""
        self.client = client
        self.bus = bus
        self.providers = providers  # whose pending sets the sweeper watches
        self._record = client.register_script(RECORD_LUA)
        self._sweeper: gevent.Greenlet | None = None
        self._failures = Failures(log, redis_url)  # deliveries failing together make a line a minute

    def record(
        self, provider: str, delivery_id: str, kind: str, payload, user_id: str | None, also_known_as: tuple = ()
    ) -> bool:
        """Store a verified delivery once; False if its id (or another of its keys) was seen before.

        `also_known_as` are further identities of the same delivery, e.g. the hash of a body whose
        signature does not cover the delivery id. Concurrent copies are safe: one Lua step decides.
        """
        encoded = json.dumps(payload, separators=(",", ":"))
        record = {
            "id": delivery_id,
            "provider": provider,
            "type": kind,
            "user_id": user_id or "",
            "received_at": f"{time.time():.3f}",
            "status": "pending",
            "payload": encoded,
        }
        created = self._record(
            keys=[
                Keys.webhook_delivery(provider, delivery_id),
                Keys.webhook_log(provider),
                Keys.webhook_pending(provider),
            ]
            + [Keys.webhook_seen(provider, identity) for identity in also_known_as],
            args=[RETENTION_SECONDS, LOG_LENGTH, f"{provider}\n{delivery_id}", f"{time.time():.3f}", delivery_id]
            + [item for pair in record.items() for item in pair],
        )
        return bool(created)

    def publish_soon(self, provider: str, delivery_id: str) -> None:
        """Publish in the background: the provider's answer does not wait for it."""
        self.ensure_sweeper()
        gevent.spawn(self.publish_pending, f"{provider}\n{delivery_id}")

    def publish_pending(self, member: str) -> bool:
        """Claim one pending delivery and publish it; put it back on a Redis failure, retire it on any other.

        A record that cannot be published for a reason other than Redis (it would fail again forever)
        is marked `failed` and logged, so no one record can wedge the sweeper.
        """
        provider, _, delivery_id = member.partition("\n")
        try:
            if not self.client.zrem(Keys.webhook_pending(provider), member):
                return False  # another greenlet (or worker) has it
        except redis.exceptions.RedisError:
            return False
        key = Keys.webhook_delivery(provider, delivery_id)
        try:
            record = self.client.hgetall(key)
            if not record:
                return False  # expired before it could be published
            self._publish(record)
            self.client.hset(key, mapping={"status": "published", "published_at": f"{time.time():.3f}"})
            return True
        except redis.exceptions.RedisError as error:
            self._failures.failed("publishing a webhook delivery (it will be retried)", error)
            try:
                self.client.zadd(Keys.webhook_pending(provider), {member: time.time() + RETRY_DELAY})
            except redis.exceptions.RedisError as again:
                log.error(
                    "webhook delivery %s of %s could not be re-queued: redis at %s unavailable (%s)",
                    delivery_id,
                    provider,
                    self._failures.where,
                    redis_error(again),
                )
            return False
        except Exception as error:  # the record itself is bad: retrying would fail the same way forever
            log.error(
                "webhook delivery %s of %s cannot be published (%s); marked failed",
                delivery_id,
                provider,
                type(error).__name__,
            )
            with contextlib.suppress(redis.exceptions.RedisError):
                self.client.hset(key, "status", "failed")
            return False

    def _publish(self, record: dict) -> None:
        payload_text = record["payload"]
        small = len(payload_text.encode()) <= PAYLOAD_IN_EVENT_LIMIT
        data = {
            "provider": record["provider"],
            "delivery_id": record["id"],
            "type": record["type"],
            "payload": json.loads(payload_text) if small else None,
            "truncated": not small,
        }
        name = event_name(record["provider"], record["type"])
        self.bus.publish(WEBHOOKS, name, data)
        if record.get("user_id"):
            self.bus.publish(user_channel(record["user_id"]), name, data)

    def ensure_sweeper(self) -> None:
        """Start the sweeper greenlet unless it runs."""
        if self._sweeper is None or self._sweeper.dead:
            self._sweeper = gevent.spawn(self._sweep_forever)

    def _sweep_forever(self) -> None:
        while True:
            gevent.sleep(SWEEP_INTERVAL)
            for provider in self.providers:
                self.sweep(provider)

    def sweep(self, provider: str) -> None:
        """Publish the provider's deliveries that have waited longer than a sweep interval."""
        try:
            due = self.client.zrangebyscore(
                Keys.webhook_pending(provider), "-inf", time.time() - SWEEP_INTERVAL, start=0, num=100
            )
        except redis.exceptions.RedisError:
            return
        for member in due:
            try:
                self.publish_pending(member)
            except Exception:  # the loop outlives any one delivery
                log.exception("webhook sweeper: unexpected failure")

    def recent(self, provider: str, limit: int) -> list[dict]:
        """A provider's most recent deliveries, newest first."""
        ids = self.client.lrange(Keys.webhook_log(provider), 0, limit - 1)
        pipe = self.client.pipeline(transaction=False)
        for delivery_id in ids:
            pipe.hmget(Keys.webhook_delivery(provider, delivery_id), "id", "type", "status", "received_at", "user_id")
        rows = []
        for values in pipe.execute():
            if values[0] is None:
                continue  # expired
            delivery_id, kind, status, received_at, user_id = values
            rows.append(
                {
                    "id": delivery_id,
                    "type": kind,
                    "status": status,
                    "received_at": received_at,
                    "user_id": user_id or None,
                }
            )
        return rows
