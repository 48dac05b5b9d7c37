"""The delivery process (`worker:` in the Procfile, `python worker.py`): dispatch, attempts, retries.

Greenlets of one process, each a loop that outlives Redis outages:

- dispatch: reads the feed of published events (a consumer group), matches each event against the
  endpoints and turns every match into a message in that endpoint's queue (one Lua step per endpoint),
  then acknowledges the feed entries;
- read: takes entries from the queues of endpoints that have a free slot (at most
  WEBHOOK_OUT_ENDPOINT_CONCURRENCY attempts in flight per endpoint), so a slow endpoint only ever
  occupies its own slots and never the reader;
- schedule: moves retries whose time has come from each endpoint's retry schedule back into its queue
  (one step per endpoint, all endpoints in one round trip per Redis node);
- claim: takes over entries left pending by a delivery process that died (its heartbeat expired) or
  that no one has touched for much longer than an attempt can take;
- heartbeat, and a pub/sub listener that wakes the reader when something is queued.

The OpenID provider's back-channel logouts go the same way: each client told of logouts is a target whose
queue, retries and attempts are an endpoint's (app/outgoing/backchannel.py), read, retried and claimed by the
same loops; only what an attempt sends differs (a logout token signed at that attempt, no webhook signature).

Every entry read stays in the consumer group's pending list until the Lua step that records its
attempt acknowledges it, so a process killed mid-attempt loses nothing: another one (or its
successor) claims the entry and sends the message again with the same `webhook-id`.

On a Redis Cluster nothing changes but the round trips: every command names keys of one hash slot (a
queue per command when reading), and an outage of one node (a failover) is an outage like any other.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import time
from collections import defaultdict

import gevent
import gevent.event
import redis
from flask import Flask

from ..events.bus import Event
from ..metrics import WEBHOOK_ATTEMPT_SECONDS, WEBHOOK_ATTEMPTS, WEBHOOK_MESSAGES
from ..redis import Keys, Outage, describe_redis, redis_error
from .backchannel import BACKCHANNEL_ATTEMPTS, BACKCHANNEL_LOGOUTS, NEVER_DISABLED, NotSendable, Targets, is_target
from .sender import AttemptResult, Sender
from .signing import signature_headers
from .store import DELIVER_GROUP, DISPATCH_GROUP, WAKE_CHANNEL, Endpoint, OutgoingStore

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL, HEARTBEAT_TTL = 1.0, 5  # a process silent for 5 s is taken for dead
CLAIM_INTERVAL = 1.0
CLAIM_MIN_IDLE_MS = 1000
DISPATCH_BATCH = 100
READ_REFRESH = 0.1  # the reader looks for new endpoints (new queues) at most this often
FULL_RELOAD = 10.0  # endpoints are reloaded at least this often, even if no change was counted
IDLE_WAIT = 1.0  # the longest a reader waits without a wake-up before looking at the queues again
SCHEDULE_WAIT = 0.5  # the longest the scheduler sleeps; a due retry waits at most this long
RECORD_PATIENCE = 60.0  # how long an attempt's outcome is kept trying to be written while Redis is away
BACKOFF_START, BACKOFF_CAP = 0.1, 5.0
# Redis (or, on a cluster, one of its nodes) unavailable for now: a failover is one of these for seconds.
# RedisClusterException also covers "no node reachable" (redis-py raises it when it cannot map the slots);
# a message must not be marked failed for any of them, only tried again later.
REDIS_DOWN = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.TryAgainError,
    redis.exceptions.RedisClusterException,
)


def no_group(error) -> bool:
    """Whether Redis answered NOGROUP: the stream or its consumer group is gone (an endpoint deleted, a
    database flushed or restored) since this process last looked."""
    return isinstance(error, redis.exceptions.ResponseError) and "NOGROUP" in str(error)


class DeliveryWorker:
    """One delivery process's loops (see the module docstring)."""

    def __init__(self, app: Flask):
        self.settings = app.config["SETTINGS"].outgoing_webhooks
        self.client: redis.Redis = app.extensions["redis"]
        self.redis_url = app.config["SETTINGS"].redis_url
        self.app = app
        self.store: OutgoingStore = app.extensions["outgoing_store"]
        self.targets: Targets = app.extensions["backchannel_targets"]
        # What a back-channel logout attempt sends (the OpenID provider registers it; absent: nothing is sent).
        self.build_logout = app.extensions.get("backchannel_logout_request")
        self.sender = Sender(self.settings, self.settings.endpoint_concurrency)
        self.name = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.bound = self.settings.endpoint_concurrency
        # The stalest an entry can be while an attempt on it is still running; past it, whoever holds it
        # (even a live process, e.g. one whose outcome could not be written) is taken not to.
        self.stale_ms = int((2 * self.settings.timeout_seconds + RECORD_PATIENCE + 30) * 1000)
        self.endpoints: dict[str, Endpoint] = {}
        self.version: str | None = None
        self.loaded = 0.0  # when the endpoints were last loaded
        self.refreshed = 0.0  # when the reader last looked for new endpoints
        self.active: dict[str, int] = defaultdict(int)
        self.in_flight: set[tuple[str, str]] = set()
        self.wake = gevent.event.Event()
        # Read this consumer's own pending entries first (after a start or an outage): a reply lost on
        # the way still left the entries pending for this consumer.
        self.recover_feed = self.recover_queues = True
        self.stopping = False
        self._greenlets: list[gevent.Greenlet] = []

    # Life cycle

    def run(self) -> None:
        """Run every loop until SIGTERM or SIGINT, then let attempts in flight finish (bounded)."""
        gevent.signal_handler(signal.SIGTERM, self.stop)
        gevent.signal_handler(signal.SIGINT, self.stop)
        self.start()
        log.info("outgoing webhooks: delivery process %s started", self.name)
        while not self.stopping:
            gevent.sleep(0.2)
        deadline = time.monotonic() + self.settings.timeout_seconds + 5
        while self.in_flight and time.monotonic() < deadline:
            gevent.sleep(0.05)
        gevent.killall(self._greenlets, timeout=2)
        log.info("outgoing webhooks: delivery process %s stopped", self.name)

    def start(self) -> None:
        """Start the loops in greenlets (also used by tests that run a worker in-process)."""
        for loop in (self._heartbeat, self._listen, self._dispatch, self._schedule, self._read, self._claim):
            self._greenlets.append(gevent.spawn(self._forever, loop))

    def stop(self) -> None:
        """Stop taking work; attempts in flight finish and are recorded."""
        self.stopping = True
        self.wake.set()

    def _forever(self, loop) -> None:
        """Run one loop step after another; a Redis outage means back-off, never the loop's end."""
        backoff = BACKOFF_START
        outage = Outage(log, f"outgoing webhooks: {loop.__name__.strip('_')}", self.redis_url)  # one line an outage
        while not self.stopping:
            try:
                loop()
                backoff = BACKOFF_START
                outage.succeeded()
            except REDIS_DOWN as error:
                self.recover_feed = self.recover_queues = True
                outage.failed(error)
                gevent.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)
            except Exception:  # a bug in one step must not end delivery for good
                log.exception("outgoing webhooks: %s failed; again in %.1f s", loop.__name__, backoff)
                gevent.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)

    # Endpoints

    def _refresh_endpoints(self) -> None:
        """Reload the endpoints when any changed (every change bumps the version), and now and then anyway:
        a process that died between a change and its bump leaves the version as it was."""
        version = self.store.endpoints_version()
        if version != self.version or time.monotonic() - self.loaded > FULL_RELOAD:
            if time.monotonic() - self.loaded > FULL_RELOAD:
                self.store.migrate_legacy_retries()
                self.targets.prune(time.time())
            # Back-channel targets are held as endpoints that want no event: read, retried and claimed alike.
            loaded = [*self.store.load_endpoints(), *self.targets.load()]
            self.endpoints = {endpoint.id: endpoint for endpoint in loaded}
            self.version, self.loaded = version, time.monotonic()
            self.sender.forget(set(self.endpoints))

    # Loops (each function is one step; _forever repeats it)

    def _heartbeat(self) -> None:
        self.client.set(Keys.outgoing_consumer(self.name), "1", ex=HEARTBEAT_TTL)
        gevent.sleep(HEARTBEAT_INTERVAL)

    def _listen(self) -> None:
        """Wake the reader whenever any process queues something."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(WAKE_CHANNEL)
            self.wake.set()  # something may have been queued while not listening
            while not self.stopping:
                if pubsub.get_message(timeout=IDLE_WAIT) is not None:
                    self.wake.set()
        finally:
            pubsub.close()

    def _dispatch(self) -> None:
        """Match a batch of published events against the endpoints; each becomes its endpoints' messages."""
        feed = Keys.outgoing_feed()
        try:
            position = "0" if self.recover_feed else ">"
            batches = self.client.xreadgroup(
                DISPATCH_GROUP,
                self.name,
                {feed: position},
                count=DISPATCH_BATCH,
                block=None if position == "0" else 1000,
            )
        except redis.exceptions.ResponseError as error:
            if not no_group(error):
                raise
            self._create_group(feed, DISPATCH_GROUP)
            return
        entries = batches[0][1] if batches else []
        if position == "0" and not entries:
            self.recover_feed = False
        if entries:
            self._dispatch_entries(entries)

    def _dispatch_entries(self, entries) -> None:
        self._refresh_endpoints()  # after the read: an endpoint made before an event was published is seen
        matches: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
        for _, fields in entries:
            if not fields:  # deleted while pending: only acknowledged
                continue
            event = Event.from_entry(fields["id"], fields["channel"], fields)
            body = event.as_json()
            for endpoint in self.endpoints.values():
                if not endpoint.disabled and endpoint.wants(event.channel, event.event):
                    matches[endpoint.id].append((event.id, event.channel, event.event, body))
        created = self.store.dispatch(matches, [entry_id for entry_id, _ in entries])
        if created:
            WEBHOOK_MESSAGES.labels("created").inc(created)

    def _schedule(self) -> None:
        """Move due retries into their queues; sleep until the next is due (at most SCHEDULE_WAIT)."""
        self._refresh_endpoints()
        now = time.time()
        moved, due = self.store.release_due_retries(list(self.endpoints), now)
        if moved:
            return
        gevent.sleep(SCHEDULE_WAIT if due is None else min(max(due - now, 0.01), SCHEDULE_WAIT))

    def _read(self) -> None:
        """Start attempts for queued entries of endpoints with a free slot; wait for a wake-up when idle."""
        self.wake.clear()
        if time.monotonic() - self.refreshed > READ_REFRESH:
            self._refresh_endpoints()
            self.refreshed = time.monotonic()
        own = self.recover_queues
        ready = [ep for ep in self.endpoints if self.active[ep] < self.bound]
        started = 0
        for start in range(0, len(ready), 500):
            chunk = ready[start : start + 500]
            # One read per queue (on a cluster queues live in different slots), one round trip per node.
            pipe = self.client.pipeline(transaction=False)
            for endpoint_id in chunk:
                queue = {Keys.outgoing_queue(endpoint_id): "0" if own else ">"}
                pipe.xreadgroup(DELIVER_GROUP, self.name, queue, None if own else self.bound - self.active[endpoint_id])
            for endpoint_id, found in zip(chunk, pipe.execute(raise_on_error=False), strict=True):
                if no_group(found):
                    self.store.ensure_group(endpoint_id)  # lost its group (deleted endpoint, restored Redis)
                    self.version = None
                    continue
                if isinstance(found, Exception):
                    raise found
                for _, entries in found or []:
                    for entry_id, fields in entries:
                        if self._start_attempt(endpoint_id, entry_id, fields):
                            started += 1
        if own:
            self.recover_queues = False
        if not started and not self.stopping:
            self.wake.wait(IDLE_WAIT)

    def _claim(self) -> None:
        """Take over entries of dead processes (no heartbeat), and entries stale far beyond any attempt."""
        gevent.sleep(CLAIM_INTERVAL)
        self._refresh_endpoints()
        queues = [(Keys.outgoing_queue(ep), DELIVER_GROUP, ep) for ep in self.endpoints]
        queues.append((Keys.outgoing_feed(), DISPATCH_GROUP, None))
        pipe = self.client.pipeline(transaction=False)
        for stream, group, _ in queues:
            pipe.xinfo_consumers(stream, group)
        answers = pipe.execute(raise_on_error=False)
        others = {
            consumer["name"]
            for answer in answers
            if not isinstance(answer, Exception)
            for consumer in answer
            if consumer["name"] != self.name
        }
        others = sorted(others)
        pipe = self.client.pipeline(transaction=False)  # heartbeats live in different slots: no MGET
        for name in others:
            pipe.get(Keys.outgoing_consumer(name))
        alive = dict(zip(others, pipe.execute(), strict=True)) if others else {}
        for (stream, group, endpoint_id), answer in zip(queues, answers, strict=True):
            if isinstance(answer, Exception):
                continue
            for consumer in answer:
                name = consumer["name"]
                if name == self.name or alive.get(name):
                    continue
                if consumer["pending"]:
                    self._take_over(stream, group, endpoint_id, name)
                else:
                    self.client.xgroup_delconsumer(stream, group, name)  # dead and owning nothing: tidy up
            self._take_stale(stream, group, endpoint_id)

    # Claiming

    def _take_over(self, stream: str, group: str, endpoint_id: str | None, dead: str) -> None:
        try:
            pending = self.client.xpending_range(stream, group, "-", "+", 100, consumername=dead)
        except redis.exceptions.ResponseError as error:
            if not no_group(error):
                raise
            return  # the queue went away since it was listed, with whatever the dead process held
        ids = [item["message_id"] for item in pending]
        if not ids:
            return
        # An idle time of at least a second: when two processes see the same dead one, the first claim
        # makes the entries fresh again and the second one's claim takes nothing.
        claimed = self.client.xclaim(stream, group, self.name, CLAIM_MIN_IDLE_MS, ids)
        log.warning("outgoing webhooks: took over %d entries of %s from %s (no heartbeat)", len(ids), stream, dead)
        self._handle_claimed(endpoint_id, claimed, stream, group)

    def _take_stale(self, stream: str, group: str, endpoint_id: str | None) -> None:
        try:
            _, claimed, *_ = self.client.xautoclaim(stream, group, self.name, self.stale_ms, "0-0", count=100)
        except redis.exceptions.ResponseError as error:
            if not no_group(error):
                raise
            return  # the queue went away since it was listed (its endpoint deleted): nothing is left to take
        claimed = [(entry_id, fields) for entry_id, fields in claimed if (endpoint_id, entry_id) not in self.in_flight]
        if claimed:
            log.warning("outgoing webhooks: took over %d stale entries of %s", len(claimed), stream)
            self._handle_claimed(endpoint_id, claimed, stream, group)

    def _handle_claimed(self, endpoint_id: str | None, claimed, stream: str, group: str) -> None:
        if endpoint_id is None:
            self._dispatch_entries(claimed)
            return
        for entry_id, fields in claimed:
            if fields:
                self._start_attempt(endpoint_id, entry_id, fields)
            else:  # the entry itself was deleted (its endpoint went): only acknowledge it
                self.client.xack(stream, group, entry_id)

    # Attempts

    def _start_attempt(self, endpoint_id: str, entry_id: str, fields: dict) -> bool:
        key = (endpoint_id, entry_id)
        if key in self.in_flight:
            return False
        self.in_flight.add(key)
        self.active[endpoint_id] += 1
        gevent.spawn(self._attempt, endpoint_id, entry_id, fields.get("m", ""))
        return True

    def _attempt(self, endpoint_id: str, entry_id: str, msg_id: str) -> None:
        try:
            self._attempt_once(endpoint_id, entry_id, msg_id)
        except REDIS_DOWN as error:
            # The entry stays pending for this consumer and is read again once Redis answers.
            log.warning(
                "outgoing webhooks: attempt for %s not completed: cannot reach redis at %s (%s)",
                msg_id,
                describe_redis(self.redis_url),
                redis_error(error),
            )
            self.recover_queues = True
        except Exception:
            # Not Redis: the same entry would fail the same way again, so it is not read again.
            log.exception("outgoing webhooks: attempt for %s failed unexpectedly; marked failed", msg_id)
            try:
                self.store.give_up(endpoint_id, msg_id, entry_id)
            except redis.exceptions.RedisError:
                self.recover_queues = True
        finally:
            self.in_flight.discard((endpoint_id, entry_id))
            self.active[endpoint_id] -= 1
            self.wake.set()

    def _attempt_once(self, endpoint_id: str, entry_id: str, msg_id: str) -> None:
        # The endpoint as it is now, read with the message (same slot, one round trip), so a PATCH or
        # DELETE applies to messages already queued.
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(Keys.outgoing_message(endpoint_id, msg_id))
        pipe.hgetall(Keys.outgoing_endpoint(endpoint_id))
        record, stored = pipe.execute()
        if is_target(stored):
            self._attempt_logout(endpoint_id, entry_id, msg_id, record, stored)
            return
        endpoint = Endpoint.from_record(stored) if stored else None
        if not record or endpoint is None or endpoint.disabled:
            self.store.give_up(endpoint_id, msg_id, entry_id)
            if record:
                WEBHOOK_MESSAGES.labels("failed").inc()
            return
        now = time.time()
        headers = signature_headers(msg_id, record["body"], endpoint.signing_secrets(now), now)
        headers["Content-Type"] = "application/json"
        result = self.sender.send(endpoint_id, endpoint.url, record["body"].encode(), headers)
        WEBHOOK_ATTEMPTS.labels(result.kind).inc()
        WEBHOOK_ATTEMPT_SECONDS.observe(result.duration_ms / 1000)
        outcome = self._record(endpoint_id, msg_id, entry_id, result.as_record(now), result.succeeded)
        if outcome.startswith("delivered"):
            WEBHOOK_MESSAGES.labels("delivered").inc()
        elif outcome.startswith("failed"):
            WEBHOOK_MESSAGES.labels("failed").inc()
        if outcome.endswith(":disabled"):
            log.warning(
                "outgoing webhooks: endpoint %s disabled: it has only failed for %d s",
                endpoint_id,
                self.settings.disable_after_seconds,
            )

    def _attempt_logout(self, target_id: str, entry_id: str, msg_id: str, record: dict, target: dict) -> None:
        """One back-channel logout attempt: the request is made now (a freshly signed logout token, to the URI
        the client has now); a client that no longer takes logouts makes the message `failed` unsent."""
        if not record or self.build_logout is None:
            self.store.give_up(target_id, msg_id, entry_id)
            if record:
                BACKCHANNEL_LOGOUTS.labels("failed").inc()
            return
        client_id, started, now = target.get("client_id"), time.monotonic(), time.time()
        try:
            with self.app.app_context():
                outgoing = self.build_logout(target, record)
        except NotSendable as reason:
            log.warning("back-channel logout: %s to client %s not sent: %s", msg_id, client_id, reason)
            duration = int((time.monotonic() - started) * 1000)
            result = AttemptResult(False, None, duration, str(reason), "unsendable")
        else:
            if outgoing is None:
                self.store.give_up(target_id, msg_id, entry_id)
                BACKCHANNEL_LOGOUTS.labels("failed").inc()
                return
            result = self.sender.send(target_id, outgoing.url, outgoing.body, outgoing.headers)
        BACKCHANNEL_ATTEMPTS.labels(result.kind).inc()
        outcome = self._record(target_id, msg_id, entry_id, result.as_record(now), result.succeeded, NEVER_DISABLED)
        if outcome.startswith("delivered"):
            BACKCHANNEL_LOGOUTS.labels("delivered").inc()
        elif outcome.startswith("failed"):
            BACKCHANNEL_LOGOUTS.labels("failed").inc()
            log.warning("back-channel logout: %s to client %s failed for good: %s", msg_id, client_id, result.error)

    def _record(
        self, endpoint_id: str, msg_id: str, entry_id: str, attempt: dict, succeeded: bool, disable_after=None
    ) -> str:
        """Write the outcome; while Redis is away keep trying for a while, so a restart costs no resend."""
        deadline, backoff = time.monotonic() + RECORD_PATIENCE, BACKOFF_START
        while True:
            try:
                return self.store.record_attempt(endpoint_id, msg_id, entry_id, attempt, succeeded, disable_after)
            except REDIS_DOWN:
                if time.monotonic() > deadline or self.stopping:
                    raise
                gevent.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_CAP)

    def _create_group(self, stream: str, group: str) -> None:
        try:
            self.client.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise
