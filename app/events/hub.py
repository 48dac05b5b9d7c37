"""The per-process hub: ONE Redis pub/sub connection and one greenlet, fanning out to local subscribers.

A client connection never holds a Redis connection of its own. After Redis drops, the hub reconnects
with capped back-off and tells every local subscriber to resynchronise from the streams, so nothing
published while it was away is lost.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import defaultdict, deque

import gevent
import gevent.event
import redis

from .bus import CONTROL_CHANNEL, WAKE_PREFIX, Event

log = logging.getLogger(__name__)

RESYNC = "resync"
BACKOFF_START, BACKOFF_CAP = 0.1, 5.0


class Subscription:
    """One live connection's inbox: a bounded queue of events, plus why it must end (if it must)."""

    __slots__ = ("channels", "user_id", "session_id", "maxsize", "items", "ready", "ended", "__weakref__")

    def __init__(self, channels: list[str], user_id: str, session_id: str, maxsize: int):
        self.channels = channels
        self.user_id = user_id
        self.session_id = session_id
        self.maxsize = maxsize
        self.items: deque = deque()
        self.ready = gevent.event.Event()
        self.ended: str | None = None  # session_ended | overflow | shutdown

    def offer(self, item) -> None:
        """Queue an event (or a resync); past the bound the connection ends as overflowed."""
        if len(self.items) >= self.maxsize:
            self.end("overflow")
            return
        self.items.append(item)
        self.ready.set()

    def end(self, reason: str) -> None:
        """Mark the connection to end, with the reason, and wake its reader."""
        if self.ended is None:
            self.ended = reason
        self.ready.set()

    def take(self, timeout: float | None) -> list:
        """Everything queued, waiting up to `timeout` seconds for something (or for an end)."""
        if not self.items and self.ended is None:
            self.ready.wait(timeout)
        self.ready.clear()
        taken = list(self.items)
        self.items.clear()
        return taken


class Hub:
    """This worker's one pub/sub connection, handing events and control messages to local connections."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self.by_channel: dict[str, set[Subscription]] = defaultdict(set)
        self.by_user: dict[str, set[Subscription]] = defaultdict(set)
        self.by_session: dict[str, set[Subscription]] = defaultdict(set)
        self.connected = gevent.event.Event()
        self.closing = False
        self._greenlet: gevent.Greenlet | None = None

    def subscribe(self, channels: list[str], user_id: str, session_id: str, maxsize: int) -> Subscription:
        """Register locally first; the caller reads history only after this, so nothing falls between."""
        self._ensure_running()
        subscription = Subscription(channels, user_id, session_id, maxsize)
        if self.closing:
            subscription.end("shutdown")
        for channel in channels:
            self.by_channel[channel].add(subscription)
        self.by_user[user_id].add(subscription)
        self.by_session[session_id].add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Forget a connection that has ended."""
        for index, key in [(self.by_user, subscription.user_id), (self.by_session, subscription.session_id)] + [
            (self.by_channel, channel) for channel in subscription.channels
        ]:
            members = index.get(key)
            if members is not None:
                members.discard(subscription)
                if not members:
                    del index[key]

    def shutdown(self) -> None:
        """End every local connection (worker shutting down): clients reconnect elsewhere by cursor."""
        self.closing = True
        for subscriptions in list(self.by_session.values()):
            for subscription in list(subscriptions):
                subscription.end("shutdown")

    def _ensure_running(self) -> None:
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        delay = BACKOFF_START
        while True:
            pubsub = self.client.pubsub()
            try:
                pubsub.psubscribe(WAKE_PREFIX + "*")
                pubsub.subscribe(CONTROL_CHANNEL)
                confirmed = 0
                for message in pubsub.listen():
                    kind = message["type"]
                    if kind in ("subscribe", "psubscribe"):
                        confirmed += 1
                        if confirmed == 2:  # both subscriptions live: from here on nothing is missed
                            if delay > BACKOFF_START:
                                log.warning("event hub reconnected to redis; subscribers resynchronise")
                            delay = BACKOFF_START
                            self.connected.set()
                            self._resync_all()
                    elif kind == "pmessage":
                        self._deliver(Event.from_wire(message["data"]))
                    elif kind == "message" and message["channel"] == CONTROL_CHANNEL:
                        self._control(json.loads(message["data"]))
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as error:
                self.connected.clear()
                log.warning("event hub lost redis (%s); reconnecting in %.1f s", type(error).__name__, delay)
            finally:
                with contextlib.suppress(Exception):  # the connection may already be broken
                    pubsub.close()
            gevent.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP)

    def _deliver(self, event: Event) -> None:
        for subscription in list(self.by_channel.get(event.channel, ())):
            subscription.offer(event)

    def _resync_all(self) -> None:
        for subscriptions in list(self.by_session.values()):
            for subscription in list(subscriptions):
                subscription.offer(RESYNC)

    def _control(self, message: dict) -> None:
        if message.get("whole_user"):
            targets = list(self.by_user.get(message["user_id"], ()))
        else:
            targets = [s for sid in message.get("session_ids", []) for s in self.by_session.get(sid, ())]
        for subscription in targets:
            subscription.end("session_ended")
