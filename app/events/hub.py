"""The per-process hub: ONE Redis pub/sub connection and one listener greenlet, fanning out to local subscribers.

A client connection never holds a Redis connection of its own. The worker subscribes to `wake:<channel>`
only while one of its connections reads that channel (the first reader subscribes, the last to leave
unsubscribes), and to the control channel always, so an event travels only to workers that deliver it.

No gap: `subscribe` returns only once Redis has confirmed, on the current connection, the SUBSCRIBE of
every channel the reader needs; the reader reads history after that, so each event is either in what it
reads or arrives live. Commands are written under one lock in the order the hub decides them, and Redis
answers in that order: the n-th confirmation of a channel answers the n-th SUBSCRIBE sent for it. So a
reader who arrives while an UNSUBSCRIBE of its channel is still in flight waits for its own SUBSCRIBE.

After Redis drops, the hub reconnects with capped back-off, subscribes again to every channel with
readers and, once Redis has confirmed them all, tells every local subscriber to resynchronise from the
streams, so nothing published while it was away is lost. Every wait is bounded: a subscription that is
not confirmed in time is a `redis.exceptions.TimeoutError` (503), and the connection is replaced.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable

import gevent
import gevent.event
import gevent.lock
import redis

from .bus import CONTROL_CHANNEL, WAKE_PREFIX, Event

log = logging.getLogger(__name__)

RESYNC = "resync"
BACKOFF_START, BACKOFF_CAP = 0.1, 5.0
CONFIRM_TIMEOUT = 5.0  # seconds a reader waits for Redis to confirm its channels
CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


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


class Confirmation:
    """Redis's answer to one SUBSCRIBE: `done` once it came (`live`) or the connection was lost first."""

    __slots__ = ("done", "live")

    def __init__(self):
        self.done = gevent.event.Event()
        self.live = False

    def settle(self, live: bool) -> None:
        """Record the answer (or its loss) and wake whoever waits for it."""
        self.live = live
        self.done.set()


class Hub:
    """This worker's one pub/sub connection, handing events and control messages to local connections."""

    def __init__(self, connect: Callable[[], redis.Redis], confirm_timeout: float = CONFIRM_TIMEOUT):
        """`connect` makes the client of the pub/sub connection (called again after each loss)."""
        self.connect = connect
        self.confirm_timeout = confirm_timeout
        self.by_channel: dict[str, set[Subscription]] = defaultdict(set)
        self.by_user: dict[str, set[Subscription]] = defaultdict(set)
        self.by_session: dict[str, set[Subscription]] = defaultdict(set)
        self.connected = gevent.event.Event()  # set exactly while there is a current connection
        self.closing = False
        self._greenlet: gevent.Greenlet | None = None
        self._pubsub: redis.client.PubSub | None = None
        self._lock = gevent.lock.RLock()  # held while deciding and writing a (un)subscribe: wire order = order decided
        self._live: dict[str, Confirmation] = {}  # Redis channel -> its latest SUBSCRIBE on this connection
        self._unconfirmed: dict[str, deque[Confirmation]] = defaultdict(deque)  # sent, not yet answered, in order
        self._resync_when: Confirmation | None = None  # the last channel subscribed again after a (re)connect

    def subscribe(self, channels: list[str], user_id: str, session_id: str, maxsize: int) -> Subscription:
        """Register locally, then wait until Redis confirms every channel: the caller reads history after this.

        Raises redis.exceptions.TimeoutError if Redis does not confirm within the time-out.
        """
        self._ensure_running()
        subscription = Subscription(channels, user_id, session_id, maxsize)
        for channel in channels:
            self.by_channel[channel].add(subscription)
        self.by_user[user_id].add(subscription)
        self.by_session[session_id].add(subscription)
        if self.closing:
            subscription.end("shutdown")
            return subscription
        try:
            self._wait_confirmed([CONTROL_CHANNEL] + [WAKE_PREFIX + channel for channel in channels])
        except BaseException:
            self.unsubscribe(subscription)
            raise
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Forget a connection that has ended; unsubscribe from the channels it was the last reader of."""
        for index, key in [(self.by_user, subscription.user_id), (self.by_session, subscription.session_id)]:
            self._discard(index, key, subscription)
        for channel in subscription.channels:
            if self._discard(self.by_channel, channel, subscription):
                self._release(channel)

    def shutdown(self) -> None:
        """End every local connection (worker shutting down): clients reconnect elsewhere by cursor."""
        self.closing = True
        for subscriptions in list(self.by_session.values()):
            for subscription in list(subscriptions):
                subscription.end("shutdown")

    @staticmethod
    def _discard(index: dict, key: str, subscription: Subscription) -> bool:
        """Remove a subscription from one index entry; True if that emptied the entry."""
        members = index.get(key)
        if members is None or subscription not in members:
            return False
        members.discard(subscription)
        if not members:
            del index[key]
        return not members

    def _wait_confirmed(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.confirm_timeout
        for name in names:
            while True:
                confirmation = self._subscribed(name)
                if confirmation is not None and confirmation.live:
                    break
                waited_for = confirmation.done if confirmation is not None else self.connected
                if not waited_for.wait(max(0.0, deadline - time.monotonic())):
                    if confirmation is not None:  # Redis went silent: replace the connection
                        self._lost(self._pubsub, "no confirmation in time")
                    raise redis.exceptions.TimeoutError("The event hub could not subscribe in time.")

    def _subscribed(self, name: str) -> Confirmation | None:
        """The current connection's SUBSCRIBE of `name` (sent now if there is none); None without a connection.

        A confirmation that is settled but not live was lost with its connection: asking again after
        `connected` is set gives the new connection's one.
        """
        with self._lock:
            pubsub = self._pubsub
            if pubsub is None:
                return None
            if name not in self._live:
                self._send_subscribe(pubsub, [name])
            return self._live.get(name)

    def _release(self, channel: str) -> None:
        with self._lock:  # taking the lock may wait: check again whether someone started reading meanwhile
            name = WAKE_PREFIX + channel
            pubsub = self._pubsub
            if channel in self.by_channel or pubsub is None or name not in self._live:
                return
            del self._live[name]
            self._write(pubsub, pubsub.unsubscribe, [name])

    def _send_subscribe(self, pubsub, names: list[str]) -> list[Confirmation]:
        """SUBSCRIBE (lock held); each confirmation is registered before the command can be answered."""
        confirmations = []
        for name in names:
            confirmation = self._live[name] = Confirmation()
            self._unconfirmed[name].append(confirmation)
            confirmations.append(confirmation)
        self._write(pubsub, pubsub.subscribe, names)
        return confirmations

    def _write(self, pubsub, command, names: list[str]) -> None:
        try:
            command(*names)
        except CONNECTION_ERRORS as error:
            self._lost(pubsub, type(error).__name__)
        except BaseException:  # interrupted mid-write (a killed greenlet): the stream may hold half a command
            self._lost(pubsub, "interrupted write")
            raise

    def _ensure_running(self) -> None:
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        delay = BACKOFF_START
        while True:
            pubsub = None
            reason = "connection closed"
            try:
                pubsub = self.connect().pubsub()
                self._attach(pubsub)
                for message in pubsub.listen():
                    if self._pubsub is not pubsub:
                        break
                    if self._handle(message):  # every channel subscribed again: from here nothing is missed
                        if delay > BACKOFF_START:
                            log.warning("event hub reconnected to redis; subscribers resynchronise")
                        delay = BACKOFF_START
                        self._resync_all()
            except CONNECTION_ERRORS as error:
                reason = type(error).__name__
            finally:
                self._lost(pubsub, reason)
            gevent.sleep(delay)
            delay = min(delay * 2, BACKOFF_CAP)

    def _attach(self, pubsub) -> None:
        """Make `pubsub` the connection and subscribe it to the control channel and every channel read here."""
        with self._lock:
            self._pubsub = pubsub
            names = [CONTROL_CHANNEL] + [WAKE_PREFIX + channel for channel in self.by_channel]
            confirmations = self._send_subscribe(pubsub, names)
            if self._pubsub is pubsub:  # the write may have failed
                self._resync_when = confirmations[-1]  # Redis confirms in order: the last means all
                self.connected.set()

    def _lost(self, pubsub, reason: str) -> None:
        """Forget a connection (idempotent): waiters for its confirmations try again on the next one."""
        if pubsub is not None and pubsub is self._pubsub:
            log.warning("event hub lost redis (%s); reconnecting", reason)
            self._pubsub = None
            self.connected.clear()
            self._live.clear()
            self._resync_when = None
            unconfirmed, self._unconfirmed = self._unconfirmed, defaultdict(deque)
            for confirmation in (c for queue in unconfirmed.values() for c in queue):
                confirmation.settle(live=False)
        if pubsub is not None:
            with contextlib.suppress(Exception):  # the connection may already be broken
                pubsub.close()

    def _handle(self, message: dict) -> bool:
        """Act on one message from Redis; True when it completes the subscriptions after a (re)connect."""
        kind, name = message["type"], message["channel"]
        if kind == "message":
            if name == CONTROL_CHANNEL:
                self._control(json.loads(message["data"]))
            else:
                self._deliver(Event.from_wire(message["data"]))
        elif kind == "subscribe":
            queue = self._unconfirmed[name]
            confirmation = queue.popleft()
            if not queue:
                del self._unconfirmed[name]
            confirmation.settle(live=True)
            if confirmation is self._resync_when:
                self._resync_when = None
                return True
        return False

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
