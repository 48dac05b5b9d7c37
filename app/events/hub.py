"""The per-process hub: a few Redis pub/sub links and their listener greenlets, fanning out to local subscribers.

A client connection never holds a Redis connection of its own. The worker subscribes to a channel's
wake-ups (`wake:{<channel>}`) only while one of its connections reads that channel (the first reader
subscribes, the last to leave unsubscribes), and to the control channel always, so an event travels only
to workers that deliver it. On one Redis that is one connection (SUBSCRIBE); on a Redis Cluster one
connection per primary that serves a channel read here (SSUBSCRIBE), see links.py.

No gap: `subscribe` returns only once Redis has confirmed, on the current connection of each channel's
link, the SUBSCRIBE of every channel the reader needs (all of them at once: checked together after the
last wait); the reader reads history after that, so each event is either in what it reads or arrives
live. The channels a reader still lacks go out in one SUBSCRIBE per link, and readers of a channel
already asked for wait for that same confirmation. Commands are written under one lock in the order the
hub decides them, and Redis answers each connection in that order: the n-th confirmation of a channel
answers the n-th SUBSCRIBE sent for it. So a reader who arrives while an UNSUBSCRIBE of its channel is
still in flight waits for its own SUBSCRIBE.

After a link loses its connection it reconnects with capped back-off, subscribes again to its channels
and, once Redis has confirmed them all, tells their local readers to resynchronise from the streams, so
nothing published while it was away is lost. Only readers confirmed before that SUBSCRIBE was sent
resynchronise: one still waiting for its confirmation reads its history after it anyway, so the readers
of a link's first connection (a fresh worker) read history once, not twice. On a cluster, each loss
first refreshes the slot map: channels whose slot another node serves now (a replica took over, a slot
moved) move to that node's link and their readers resynchronise once they are confirmed there; so do
channels Redis drops unasked (an `sunsubscribe` it pushes when their slot leaves the node).

Every wait is bounded. A link busy with what Redis sent (a long fan-out, thousands of confirmations in a
storm of new readers) is not a silent Redis: a reader waits for its confirmation while the link shows
life, up to CONFIRM_LIMIT. Only when the link's connection has been quiet for CONFIRM_TIMEOUT (nothing
received while a confirmation is due) is Redis taken for silent: the connection is replaced and the
reader gets a `redis.exceptions.TimeoutError` (503), as it does past the limit or without a connection.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from typing import NamedTuple

import gevent
import gevent.event
import gevent.lock
import redis

from ..redis import describe_redis, redis_error
from .bus import CONTROL_CHANNEL, Event, channel_of_wake, wake_channel
from .links import Cluster, Link, OneServer, next_turn

log = logging.getLogger(__name__)

RESYNC = "resync"
# Seconds a reader waits for Redis to confirm its channels, and the silence (a link's connection quiet
# while a confirmation is due) that makes the hub take Redis for gone and replace the connection.
CONFIRM_TIMEOUT = 5.0
# Seconds a reader waits at most while its link is busy (alive, but its confirmation queued behind a
# long fan-out or thousands of others): a storm of readers on a fresh worker must not look like a
# silent Redis, whose replacement would resynchronise every reader of the link and add to the storm.
CONFIRM_LIMIT = 30.0
# Deliveries (events times readers) between two yields of the fan-out, about 2 ms of CPU. A broadcast to
# 10,000 readers, or a backlog of 100 events to 1,000, takes the CPU for a good part of a second; in slices,
# a request (a publish, a login) waits for one slice, not for all of it. A request needs several turns (its
# reading, its Redis round trips, its answer): under wrk -c64 during broadcasts to 10,000 streams, slices of
# 1,000 put the API's p99 at 453 ms, of 250 at 283 ms, of 100 at 64 ms (bench/README.md). The broadcast
# then shares the worker with the requests, and takes longer while they keep it busy.
FAN_OUT_SLICE = 100
CONTROL_PREFIX = '{"control"'  # a control message on a channel's own wake-up channel, not an event


def _names_org(channel: str, org_id: str) -> bool:
    """Whether a channel's name (after `<ns>:`) is the organization's id or starts with it and a dot."""
    name = channel.partition(":")[2]
    return name == org_id or name.startswith(f"{org_id}.")


class Unsubscribed(NamedTuple):
    """A channel taken from a live connection: its reader tells the client, and reads the channel no more."""

    channel: str
    reason: str  # revoked | expired | namespace_deleted | access_changed


class Subscription:
    """One live connection's inbox: a bounded queue of events, plus why it must end (if it must).

    While its reader is parked with nothing queued, the reader may lend an `outlet` (outlet.py): events
    are then written to the client at once, in the hub's greenlet, and the reader is woken only when the
    outlet stalls (its socket would block, or the client left). A stream parked without a greenlet
    (parked.py) is woken through its `parked` record instead.
    """

    __slots__ = (
        "channels",
        "user_id",
        "session_id",
        "is_admin",
        "maxsize",
        "items",
        "ready",
        "ended",
        "outlet",
        "parked",
        "expiries",
        "confirmed_in",
        "__weakref__",
    )

    def __init__(self, channels: list[str], user_id: str, session_id: str, maxsize: int, is_admin: bool = False):
        self.channels = list(channels)
        self.user_id = user_id
        self.session_id = session_id
        self.is_admin = is_admin
        self.maxsize = maxsize
        self.items: list = []  # rarely used (the outlet writes most events): an empty list is the smallest
        self.ready = gevent.event.Event()
        self.ended: str | None = None  # session_ended | overflow | shutdown | gone
        self.outlet = None
        self.parked = None
        self.expiries: dict | None = None  # channel -> the timer of its grant's end (members channels only)
        self.confirmed_in: int | None = None  # the hub's epoch when Redis had confirmed all its channels

    def wake(self) -> None:
        """Wake the reader: its waiting greenlet, or a greenlet for its parked stream."""
        if self.parked is None:
            self.ready.set()
        else:
            self.parked.wake()

    def offer(self, item) -> None:
        """Deliver an event through the outlet, or queue it (or a resync); past the bound the connection ends."""
        outlet = self.outlet
        if outlet is not None:
            if item.__class__ is Event and outlet.write(item):  # not a resync or a notice: those wake the reader
                if not outlet.stalled:
                    return
                self.outlet = None  # the reader finishes the write, then queued items follow it
                self.wake()
                return
            self.outlet = None
        if len(self.items) >= self.maxsize:
            self.end("overflow")
            return
        self.items.append(item)
        self.wake()

    def offer_all(self, events: list) -> None:
        """Several events of one channel: through the outlet in one write, or queued one by one."""
        outlet = self.outlet
        if outlet is not None and len(events) > 1:
            if outlet.write_all(events):
                if outlet.stalled:
                    self.outlet = None
                    self.wake()
                return
            self.outlet = None
        for event in events:
            self.offer(event)

    def end(self, reason: str) -> None:
        """Mark the connection to end, with the reason, and wake its reader."""
        if self.ended is None:
            self.ended = reason
        self.outlet = None
        self.wake()

    def take(self, timeout: float | None, outlet=None) -> list:
        """Everything queued, waiting up to `timeout` seconds for something (or for an end).

        With an `outlet`, events that arrive meanwhile are written through it instead of queued.
        """
        if not self.items and self.ended is None:
            self.outlet = outlet
            try:
                self.ready.wait(timeout)
            finally:
                self.outlet = None
        return self.take_now()

    def take_now(self) -> list:
        """Everything queued, without waiting."""
        self.ready.clear()
        taken, self.items = self.items, []
        return taken


class Hub:
    """This worker's pub/sub links (one per Redis node it reads from), handing events to local connections."""

    def __init__(
        self,
        topology: OneServer | Cluster,
        confirm_timeout: float = CONFIRM_TIMEOUT,
        access=None,
        confirm_limit: float = CONFIRM_LIMIT,
    ):
        """`topology` says which node carries a channel and makes each link's connection; `access(user_id,
        is_admin, channels)` answers each channel's Access now (app/channels/access.py), for re-checks."""
        self.topology = topology
        self.access = access
        self.confirm_timeout = confirm_timeout
        self.confirm_limit = max(confirm_limit, confirm_timeout)
        # Counts SUBSCRIBE batches after which readers resynchronise. A reader confirmed at epoch e was
        # confirmed before batch e was sent (and needs its resynchronisation), not before later ones.
        self.epoch = 0
        self.by_channel: dict[str, set[Subscription]] = defaultdict(set)
        self.by_user: dict[str, set[Subscription]] = defaultdict(set)
        self.by_session: dict[str, set[Subscription]] = defaultdict(set)
        self.closing = False
        self.lock = gevent.lock.RLock()  # held while deciding and writing a (un)subscribe: wire order = order decided
        self.links: dict[str, Link] = {}  # node -> its link
        self.home: dict[str, str] = {}  # every Redis channel wanted here -> the node whose link carries it
        self._changed = gevent.event.Event()  # replaced (and set) whenever a link connects or channels move
        self._dropped: set[str] = set()  # channels Redis dropped, to place again
        self._placing: gevent.Greenlet | None = None
        self._refresh_failing = False

    def subscribe(
        self, channels: list[str], user_id: str, session_id: str, maxsize: int, is_admin: bool = False
    ) -> Subscription:
        """Register locally, then wait until Redis confirms every channel: the caller reads history after this.

        Raises redis.exceptions.TimeoutError if Redis does not confirm in time (see `_wait_confirmed`).
        """
        subscription = Subscription(channels, user_id, session_id, maxsize, is_admin)
        for channel in channels:
            self.by_channel[channel].add(subscription)
        self.by_user[user_id].add(subscription)
        self.by_session[session_id].add(subscription)
        if self.closing:
            subscription.end("shutdown")
            return subscription
        try:
            self._wait_confirmed([CONTROL_CHANNEL] + [wake_channel(channel) for channel in channels], subscription)
        except BaseException:
            self.unsubscribe(subscription)
            raise
        return subscription

    def add_channel(self, subscription: Subscription, channel: str) -> None:
        """A live connection reads one more channel: returns once Redis confirmed it (as `subscribe`)."""
        if channel in subscription.channels:
            return
        subscription.channels.append(channel)
        self.by_channel[channel].add(subscription)
        try:
            self._wait_confirmed([wake_channel(channel)])
        except BaseException:
            self.remove_channel(subscription, channel)
            raise

    def remove_channel(self, subscription: Subscription, channel: str) -> None:
        """A live connection reads a channel no more (idempotent): nothing of it reaches it from now on."""
        if channel in subscription.channels:
            subscription.channels.remove(channel)
        self.forget_expiry(subscription, channel)
        if self._discard(self.by_channel, channel, subscription):
            self._release(channel)

    def revoke(self, subscription: Subscription, channel: str, reason: str) -> None:
        """Take a channel from a live connection at once, and have its reader tell the client why."""
        if channel not in subscription.channels:
            return
        self.remove_channel(subscription, channel)
        subscription.offer(Unsubscribed(channel, reason))

    def unsubscribe(self, subscription: Subscription) -> None:
        """Forget a connection that has ended; unsubscribe from the channels it was the last reader of."""
        for index, key in [(self.by_user, subscription.user_id), (self.by_session, subscription.session_id)]:
            self._discard(index, key, subscription)
        left = [channel for channel in subscription.channels if self._discard(self.by_channel, channel, subscription)]
        if left:
            self._release(*left)
        for timer in (subscription.expiries or {}).values():
            timer.close()
        subscription.expiries = None

    # Access to named channels: revocations, changed rules, grants that run out.

    def watch_expiry(self, subscription: Subscription, channel: str, expires_at: float | None) -> None:
        """When the connection's grant of `channel` runs out, check again (and take the channel if it is over)."""
        self.forget_expiry(subscription, channel)
        if expires_at is None or subscription.ended is not None:
            return
        timer = gevent.get_hub().loop.timer(max(0.0, expires_at - time.time()))
        if subscription.expiries is None:
            subscription.expiries = {}
        subscription.expiries[channel] = timer
        timer.start(lambda: gevent.spawn(self.recheck, [(subscription, channel)], "expired"))

    @staticmethod
    def forget_expiry(subscription: Subscription, channel: str) -> None:
        """Stop watching the end of the connection's grant of `channel`."""
        if subscription.expiries and channel in subscription.expiries:
            subscription.expiries.pop(channel).close()

    def recheck(self, pairs: list[tuple[Subscription, str]], cause: str) -> None:
        """Ask again whether each connection may read its channel; take the channel from those that may not.

        `cause` names what made the check (access_changed, expired, resync): a channel taken for lack of
        a grant after the namespace's rules or a grant changed is `access_changed`, not `revoked`."""
        if self.access is None or not pairs:
            return
        wanted: dict[tuple[str, bool], set[str]] = defaultdict(set)
        for subscription, channel in pairs:
            wanted[(subscription.user_id, subscription.is_admin)].add(channel)
        try:
            answers = {key: self.access(key[0], key[1], sorted(channels)) for key, channels in wanted.items()}
        except Exception as error:  # noqa: BLE001 - Redis away: the reader's resync checks again later
            log.warning(
                "event hub could not check channel access at redis %s (%s)",
                describe_redis(self.topology.url),
                redis_error(error),
            )
            return
        for subscription, channel in pairs:
            access = answers[(subscription.user_id, subscription.is_admin)].get(channel)
            if access is None or channel not in subscription.channels:
                continue
            if access.allowed:
                self.watch_expiry(subscription, channel, access.expires_at)
            else:
                reason = "access_changed" if cause == "access_changed" and access.reason == "revoked" else access.reason
                self.revoke(subscription, channel, reason or cause)

    def _channel_control(self, channel: str, message: dict) -> None:
        """A grant of `channel` changed, or a member's (or every member's: no `user_id`) access to an organization's
        channel ended (sent on the channel's own wake-up, so it is in order with its events)."""
        user_id = message.get("user_id")
        targets = [s for s in self.by_channel.get(channel, ()) if user_id is None or s.user_id == user_id]
        if message.get("reason") == "revoked":
            for subscription in targets:
                if not subscription.is_admin:
                    self.revoke(subscription, channel, "revoked")
        else:
            self.recheck([(subscription, channel) for subscription in targets], "access_changed")

    def _namespace_control(self, message: dict) -> None:
        """A namespace was deleted (every reader of its channels loses them) or its rules changed (re-check)."""
        prefix = f"{message.get('namespace')}:"
        pairs = [(s, c) for c, readers in list(self.by_channel.items()) if c.startswith(prefix) for s in readers]
        if message.get("reason") == "namespace_deleted":
            for subscription, channel in pairs:
                self.revoke(subscription, channel, "namespace_deleted")
        else:
            self.recheck(pairs, "access_changed")

    def _org_control(self, message: dict) -> None:
        """Membership of an organization changed: one user's (`user_id`) or everyone's (None: it was deleted).
        Their subscriptions to channels naming the organization (`<ns>:<org id>`, `<ns>:<org id>.<name>`) are
        checked again; one no longer allowed is taken with reason `revoked`."""
        org_id, user_id = message.get("org_id"), message.get("user_id")
        if not isinstance(org_id, str) or not org_id:
            return
        if user_id is None:
            readers = {s for subscriptions in self.by_user.values() for s in subscriptions}
        else:
            readers = set(self.by_user.get(user_id, ()))
        pairs = [(s, c) for s in readers if not s.is_admin for c in s.channels if _names_org(c, org_id)]
        self.recheck(pairs, "revoked")

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

    def next_epoch(self) -> int:
        """A batch of SUBSCRIBEs whose readers resynchronise is sent now (lock held): its epoch."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        return epoch

    def _wait_confirmed(self, names: list[str], subscription: Subscription | None = None) -> None:
        """Wait until every one of `names` is confirmed on its link's current connection, all at once.

        Each pass subscribes (in one command per link) what is not asked for yet and waits for one
        confirmation still due; after the last wait all are checked again, so a channel confirmed on a
        connection lost meanwhile is asked for again. A `subscription` confirmed so is marked with the
        epoch, so resynchronisations sent before it (it reads its history after this) skip it.

        Past CONFIRM_TIMEOUT the wait goes on while the link shows life (`Link.silent_for`), up to
        CONFIRM_LIMIT: a busy link is not a silent Redis. A connection quiet for CONFIRM_TIMEOUT with a
        confirmation due is replaced.
        """
        started = time.monotonic()
        deadline, limit = started + self.confirm_timeout, started + self.confirm_limit
        while True:
            with self.lock:
                link, pubsub, confirmation = self._first_unconfirmed(names)
                if link is None:
                    if subscription is not None and subscription.confirmed_in is None:
                        subscription.confirmed_in = self.epoch
                    return
                changed = self._changed
            # Without a connection, wait for any link to connect or channels to move, then look again.
            waited_for = confirmation.done if confirmation is not None else changed
            while not waited_for.wait(max(0.0, deadline - time.monotonic())):
                now = time.monotonic()
                if confirmation is None or now >= limit:
                    raise redis.exceptions.TimeoutError("The event hub could not subscribe in time.")
                if link.pubsub is not pubsub:  # another connection now: look again
                    break
                quiet = link.silent_for()
                if quiet >= self.confirm_timeout:  # Redis went silent: replace the connection
                    link.lost(pubsub, f"no answer for {quiet:.1f} s")
                    raise redis.exceptions.TimeoutError("The event hub could not subscribe in time.")
                deadline = min(limit, now + self.confirm_timeout - quiet)  # busy, not silent: wait on

    def _first_unconfirmed(self, names: list[str]) -> tuple[Link | None, object, object]:
        """(link, its connection, confirmation) of the first of `names` not confirmed on its link's current
        connection, (link, None, None) when that link has no connection, (None, None, None) when all are;
        what no connection has asked for yet goes out first, in one SUBSCRIBE per link (lock held)."""
        missing: dict[Link, list[str]] = {}
        for name in names:
            link = self._link_for(name)
            if link.pubsub is not None and name not in link.live:
                missing.setdefault(link, []).append(name)
        for link, batch in missing.items():
            link.send_subscribe(batch)
        for name in names:
            link = self._link_for(name)
            if link.pubsub is None:
                return link, None, None
            confirmation = link.live.get(name)
            if confirmation is None:  # the write failed (the connection was lost): the caller waits for the next
                return link, None, None
            if not confirmation.live:
                return link, link.pubsub, confirmation
        return None, None, None

    def _link_for(self, name: str) -> Link:
        """The link that carries `name` (lock held), placing the channel and starting the link if need be."""
        node = self.home.get(name)
        if node is None:
            node = self.home[name] = self.topology.node_of(name)
        link = self.links.get(node)
        if link is None or link.greenlet.dead:
            link = self.links[node] = Link(self, node)
        return link

    def _release(self, *channels: str) -> None:
        """Unsubscribe from channels nobody here reads any more: those of one link in one command (a stream that
        ends leaves its user's channel and its rooms together)."""
        leaving: dict[str, list[str]] = {}
        with self.lock:  # taking the lock may wait: check again whether someone started reading meanwhile
            for channel in channels:
                if channel in self.by_channel:
                    continue
                name = wake_channel(channel)
                node = self.home.pop(name, None)
                if node in self.links:
                    leaving.setdefault(node, []).append(name)
            for node, names in leaving.items():
                self.links[node].unsubscribe(names)

    def names_on(self, link: Link) -> list[str]:
        """The Redis channels placed on `link`'s node."""
        return [name for name, node in self.home.items() if node == link.node]

    def changed(self) -> None:
        """Wake every reader waiting for a connection: a link connected or channels moved."""
        self._changed, changed = gevent.event.Event(), self._changed
        changed.set()

    def relocate(self, link: Link) -> bool:
        """After `link` lost its connection: move its channels whose slot another node serves now.

        True when nothing is left on the link: it retires (a later reader of its node starts a new one).
        """
        if self.topology.sharded:
            self._place(self.names_on(link))
        with self.lock:
            if self.links.get(link.node) is not link:
                return True  # replaced already
            if self.names_on(link):
                return False
            del self.links[link.node]
            return True

    def dropped(self, link: Link, name: str) -> None:
        """Redis ended a subscription unasked (its slot moved): place the channel again, soon."""
        with self.lock:
            if link.live.pop(name, None) is None or self.home.get(name) != link.node:
                return
            self._dropped.add(name)
            if self._placing is None or self._placing.dead:
                self._placing = gevent.spawn(self._place_dropped)

    def _place_dropped(self) -> None:
        gevent.sleep(0)  # let the drops of one slot move arrive: one topology refresh for them all
        while self._dropped:
            names, self._dropped = list(self._dropped), set()
            self._place(names, again=True)

    def _place(self, names: list[str], again: bool = False) -> None:
        """Ask for the topology, then put each channel on its node's link (subscribing it there at once).

        Readers of a channel that changed links resynchronise from the streams once it is confirmed on
        its new one; so do those of channels subscribed `again` on the same link.
        """
        try:
            self.topology.refresh()
            self._refresh_failing = False
        except Exception as error:  # noqa: BLE001 - the cluster may be unreachable: go on with the map known
            if not self._refresh_failing:  # once per outage, not at every attempt
                log.warning(
                    "event hub could not refresh the cluster topology at %s (%s)",
                    describe_redis(self.topology.url),
                    redis_error(error),
                )
            self._refresh_failing = True
        moved: dict[str, int] = {}
        with self.lock:
            for name in names:
                old = self.home.get(name)
                if old is None:
                    continue  # nobody reads it any more
                try:
                    node = self.topology.node_of(name)
                except redis.exceptions.RedisClusterException:
                    continue  # slot not covered yet: try again at the next loss
                if node == old and not again:
                    continue  # the link reconnects and subscribes it again itself
                self.home[name] = node
                moved[node] = moved.get(node, 0) + 1
                link = self._link_for(name)
                if link.pubsub is not None and name not in link.live:
                    link.send_subscribe([name], resync=True)
            self.changed()
        for node, count in moved.items():
            log.warning("event hub placed %d channel(s) on redis %s", count, describe_redis(node))

    def deliver_all(self, messages: list[tuple[str, str]]) -> None:
        """Messages from Redis, in order: control messages, and events for local readers of their channels.

        Events of one channel that arrived together reach each reader together (one write to its socket).
        """
        batches: dict[str, list[Event]] = {}
        for name, data in messages:
            if name == CONTROL_CHANNEL:
                self._fan_out(batches)
                batches = {}
                self._control(json.loads(data))
            elif data.startswith(CONTROL_PREFIX):
                self._fan_out(batches)
                batches = {}
                self._channel_control(channel_of_wake(name), json.loads(data)["control"])
            else:
                event = Event.from_wire(data)
                batches.setdefault(event.channel, []).append(event)
        self._fan_out(batches)

    def _fan_out(self, batches: dict[str, list[Event]]) -> None:
        """Each channel's events to each of its readers; after every FAN_OUT_SLICE deliveries, requests run."""
        offered = 0
        for channel, events in batches.items():
            for subscription in list(self.by_channel.get(channel, ())):
                try:
                    subscription.offer_all(events)
                except Exception:  # one reader's failure must not keep the events from the others
                    log.exception("event hub: delivery to one connection failed")
                    subscription.end("gone")
                offered += len(events)
                if offered >= FAN_OUT_SLICE:
                    offered = 0
                    next_turn()  # requests whose sockets are ready run between two slices

    def resync(self, names: list[str], epoch: int | None = None) -> None:
        """Readers of these Redis channels may have missed messages: they read again from the streams.

        With an `epoch` (the SUBSCRIBE batch that confirmed `names` again), only readers confirmed before
        that batch was sent: one that was still waiting reads its history after its confirmation anyway,
        and would otherwise read it twice (every reader of a fresh worker's first connection)."""
        if CONTROL_CHANNEL in names:  # a session_ended may be lost: every reader checks its session
            targets = {s for subscriptions in self.by_session.values() for s in subscriptions}
        else:
            targets = {s for name in names for s in self.by_channel.get(channel_of_wake(name), ())}
        for subscription in targets:
            if epoch is None or (subscription.confirmed_in is not None and subscription.confirmed_in <= epoch):
                subscription.offer(RESYNC)

    def _control(self, message: dict) -> None:
        if "access" in message:
            self._namespace_control(message["access"])
            return
        if "org" in message:
            self._org_control(message["org"])
            return
        if message.get("whole_user"):
            targets = list(self.by_user.get(message["user_id"], ()))
        else:
            targets = [s for sid in message.get("session_ids", []) for s in self.by_session.get(sid, ())]
        for subscription in targets:
            subscription.end("session_ended")
