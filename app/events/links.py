"""The event hub's pub/sub connections: where each Redis channel lives, and one Link per Redis node.

On one Redis every channel lives on the one server and is taken with SUBSCRIBE. On a Redis Cluster a
channel (`wake:{C}`, `control`) lives on the primary serving its hash slot and is taken with SSUBSCRIBE
there, so a worker holds one connection per primary it reads channels from.
"""

from __future__ import annotations

import contextlib
import logging
import select
import time
from collections import Counter, defaultdict, deque
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import gevent
import gevent.event
import gevent.monkey
import redis
from redis._parsers.hiredis import NOT_ENOUGH_DATA

from ..redis import connect_pubsub, describe_redis

if TYPE_CHECKING:
    from .hub import Hub

log = logging.getLogger(f"{__package__}.hub")  # the hub's own log: links are part of it

BACKOFF_START = 0.1
EVENT_KINDS = ("message", "smessage")  # a reply carrying an event (decoded: the hub's connections decode)
SUBSCRIBED_KINDS = ("subscribe", "ssubscribe")
UNSUBSCRIBED_KINDS = ("unsubscribe", "sunsubscribe")
BATCH_LIMIT = 100  # messages already received that the hub fans out together
REFRESH_TIMEOUT = 5.0  # seconds for the cluster to answer its slot map
CONNECTION_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
# A link is also replaced on an error reply: a MOVED answer to SSUBSCRIBE means the slot moved before
# the topology caught up, and the replacement asks for the topology again.
LINK_ERRORS = (*CONNECTION_ERRORS, redis.exceptions.ResponseError)


class NotPrimary(redis.exceptions.ResponseError):
    """The node the slot map names is a replica now (a primary that failed over, back as a replica): the link is
    replaced as after a MOVED answer, and the replacement asks for the slot map again."""


_real_poll = gevent.monkey.get_original("select", "poll")


def next_turn() -> None:
    """Give every other greenlet whose socket is ready its turn, then continue.

    gevent.sleep(0) resumes from the loop's callbacks, which run before it polls for I/O: a greenlet that
    only ever sleeps 0 (a long fan-out in slices) keeps sockets waiting. A 0 s timer fires after the next
    poll, so requests whose sockets are ready, and new connections, run first. (gevent_worker.py does
    the same between two requests of a keep-alive connection.)
    """
    hub = gevent.get_hub()
    with hub.loop.timer(0) as turn:
        hub.wait(turn)


class OneServer:
    """One Redis: every channel on it, taken with SUBSCRIBE on one connection."""

    sharded = False
    backoff_cap = 5.0  # seconds between reconnection attempts, at most

    def __init__(self, url: str):
        self.url = url

    def node_of(self, name: str) -> str:
        """The node (its URL) that carries the Redis channel `name`."""
        return self.url

    def refresh(self) -> None:
        """Nothing to learn: the one server never moves."""

    def connect(self, node: str) -> redis.Redis:
        """The client of one pub/sub connection to `node`."""
        return connect_pubsub(node)

    def check_node(self, connection) -> None:
        """Nothing to check: the one server carries every channel."""


class Cluster:
    """A Redis Cluster: a channel lives on the primary of its hash slot, taken with SSUBSCRIBE there.

    The slot map is the cluster client's (the one requests use), refreshed after a link is lost or Redis
    drops a channel (its slot moved, or a replica took over).
    """

    sharded = True
    backoff_cap = 0.5  # a lost link asks for the topology at each attempt: a failover is seen within this

    def __init__(self, client: redis.RedisCluster, url: str):
        self.client = client
        self.url = url
        self.seed = next(seed.strip() for seed in url.split(",") if seed.strip())
        self.replicas: set[tuple[str, int]] = set()  # nodes found to be replicas, until found primaries again

    def node_of(self, name: str) -> str:
        """The primary (its URL) serving the hash slot of the Redis channel `name`, as last known."""
        node = self.client.get_node_from_key(name)
        return node_url(self.seed, node.host, node.port)

    def refresh(self) -> None:
        """Ask the cluster for its slot map again (within REFRESH_TIMEOUT, else TimeoutError)."""
        with gevent.Timeout(REFRESH_TIMEOUT, TimeoutError):  # a node that does not answer must not hold the link
            self.client.nodes_manager.initialize()

    def connect(self, node: str) -> redis.Redis:
        """The client of one pub/sub connection to `node`."""
        return connect_pubsub(node)

    def check_node(self, connection) -> None:
        """NotPrimary when the node of this connection (not subscribed yet) is a replica.

        A replica confirms SSUBSCRIBE for its primary's slots, but one that has just joined (a primary back after
        its failover, still named by a slot map from before) does not pass on what the primary publishes until
        the primary counts it in its shard: readers resynchronised there would then take a later event live and
        step over the ones published in between. Where ROLE is refused (an ACL without it, a renamed command),
        the node is taken as the map names it."""
        try:
            connection.send_command("ROLE")
            role = connection.read_response()[0]
        except redis.exceptions.ResponseError:
            return
        role = role.decode() if isinstance(role, bytes) else role
        address = (connection.host, connection.port)
        if role not in ("slave", "replica"):
            self.replicas.discard(address)
            return
        if address not in self.replicas:  # said once while the map keeps naming it
            self.replicas.add(address)
            log.warning("event hub: a node the slot map names is a replica now; asking for the map again")
        raise NotPrimary("the node is a replica now")


def node_url(seed: str, host: str, port: int) -> str:
    """The URL of one cluster node: the seed URL (credentials, TLS) with the node's address."""
    parts = urlsplit(seed)
    userinfo = parts.netloc.rpartition("@")[0]
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{address}" if userinfo else address))


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


class Replies:
    """What Redis sends a pub/sub connection, read from its socket into the connection's own hiredis reader.

    redis-py's own read of a pub/sub message (a retry wrapper, a poll for more, a logger looked up for each
    message) cost about 45 us of a worker's CPU per event; this costs a `recv` per batch and a `gets` per reply.
    """

    def __init__(self, connection):
        self.reader = connection._parser._reader
        self.sock = connection._sock
        self.space = bytearray(65536)

    def next(self):
        """The next reply, waiting for Redis as long as it takes (the hub watches for a silent Redis): the socket's
        time-out (redis-py's socket_timeout, 5 s by default) is lifted while it waits, as redis-py's own blocking
        read lifts it; an idle link would otherwise be lost, and every reader resynchronised, every few seconds."""
        reply = self.reader.gets()
        while reply is NOT_ENOUGH_DATA:
            timeout = self.sock.gettimeout()
            try:
                self.sock.settimeout(None)
                size = self.sock.recv_into(self.space)
            except OSError as error:
                raise redis.exceptions.ConnectionError(f"Error while reading from Redis: {error}") from None
            finally:
                self.sock.settimeout(timeout)
            if not size:
                raise redis.exceptions.ConnectionError("Connection closed by Redis.")
            self.reader.feed(self.space, 0, size)
            reply = self.reader.gets()
        return self._checked(reply)

    def buffered(self):
        """The next reply if it has been received already, else None (no system call)."""
        reply = self.reader.gets()
        return None if reply is NOT_ENOUGH_DATA else self._checked(reply)

    @staticmethod
    def _checked(reply):
        if isinstance(reply, Exception):  # an error reply (a MOVED answer to SSUBSCRIBE): the link is replaced
            raise reply
        return reply


class Link:
    """One pub/sub connection to one Redis node and its listener greenlet, which reconnects after a loss.

    The hub decides which channels the link carries (`hub.names_on`) and holds `hub.lock` while it
    writes to any link, so each connection's commands go out in the order decided; Redis answers in that
    order, so the n-th confirmation of a channel answers the n-th SUBSCRIBE sent for it.
    """

    def __init__(self, hub: Hub, node: str):
        self.hub = hub
        self.node = node
        self.sharded = hub.topology.sharded
        self.pubsub: redis.client.PubSub | None = None
        self.connected = gevent.event.Event()  # set exactly while there is a current connection
        self.live: dict[str, Confirmation] = {}  # Redis channel -> its latest SUBSCRIBE on this connection
        self.unconfirmed: dict[str, deque[Confirmation]] = defaultdict(deque)  # sent, not yet answered, in order
        self.unsubscribing: Counter[str] = Counter()  # UNSUBSCRIBEs decided, not yet answered
        # (UN)SUBSCRIBEs decided, not yet written, in the order decided (see `send_subscribe`, `unsubscribe`)
        self.pending: list[tuple[str, list[str]]] = []
        self.pending_soon = False  # a greenlet will write them
        # last SUBSCRIBE of a batch -> the batch, and the hub's epoch when it was sent (hub.resync)
        self.resync_after: dict[Confirmation, tuple[list[str], int]] = {}
        # Since when the listener waits for Redis with nothing left to handle; None while it handles what
        # Redis sent (or before it has a connection). A busy link is not a silent Redis: see silent_for.
        self.idle_since: float | None = None
        self.greenlet = gevent.spawn(self._run)

    # Called with hub.lock held.

    def send_subscribe(self, names: list[str], resync: bool = False) -> None:
        """SUBSCRIBE (all of `names` in one command); with `resync`, the readers of `names` that were
        confirmed before this resynchronise once Redis confirmed them all (hub.resync).

        A reader still waiting for its confirmation then is left out: it reads its history after Redis
        confirmed its channels on this connection, so it has missed nothing (and reads it once).

        On one server the channels of readers opening in a turn of the loop go out together, as the channels
        left do (see `unsubscribe`): an opening storm sent a command for each stream. A resynchronisation, and
        every command on a cluster, is written at once, after what was decided before it."""
        later = not (resync or self.sharded)
        if not later:
            self.write_pending()  # what was decided before goes out before
        pubsub = self.pubsub
        if pubsub is None:  # that write lost the connection: the callers wait for the next one
            return
        confirmations = []
        for name in names:
            confirmation = self.live[name] = Confirmation()
            self.unconfirmed[name].append(confirmation)
            confirmations.append(confirmation)
        if resync and confirmations:  # Redis confirms in order: the last means all
            self.resync_after[confirmations[-1]] = (names, self.hub.next_epoch())
        if later:
            self._later("subscribe", names)
        else:
            self._write(pubsub, "SSUBSCRIBE" if self.sharded else "SUBSCRIBE", names)

    def unsubscribe(self, names: list[str]) -> None:
        """UNSUBSCRIBE those of `names` this connection holds. On one server, the channels left during a turn of
        the loop go out together, in one command written once the connections ending in that turn have left
        theirs (a storm of 10,000 streams ending sent 10,000 commands), in the order decided among the
        SUBSCRIBEs of that turn, so Redis still sees them in the order decided. Nobody reads the channel here any
        more meanwhile: its late events are dropped as any event of a channel without readers."""
        pubsub = self.pubsub
        if pubsub is None:
            return
        held = [name for name in names if self.live.pop(name, None) is not None]
        if not held:
            return
        for name in held:
            self.unsubscribing[name] += 1
        if self.sharded:  # one command per channel anyway (a command's shard channels must share a slot)
            self._write(pubsub, "SUNSUBSCRIBE", held)
            return
        self._later("unsubscribe", held)

    def _later(self, command: str, names: list[str]) -> None:
        """Queue a command decided now, to be written with the others of this turn of the loop (hub.lock held)."""
        if self.pending and self.pending[-1][0] == command:
            self.pending[-1][1].extend(names)
        else:
            self.pending.append((command, list(names)))
        if not self.pending_soon:
            self.pending_soon = True
            gevent.spawn(self._write_soon)

    def _write_soon(self) -> None:
        """Write the commands queued (in their own greenlet, which may wait for the hub's lock)."""
        with self.hub.lock:
            self.pending_soon = False
            self.write_pending()

    def write_pending(self) -> None:
        """Write the commands decided and not yet written, in the order decided (hub.lock held)."""
        pubsub = self.pubsub
        while self.pending and pubsub is not None and pubsub is self.pubsub:
            command, names = self.pending.pop(0)
            self._write(pubsub, "SUBSCRIBE" if command == "subscribe" else "UNSUBSCRIBE", names)

    def _write(self, pubsub, command: str, names: list[str]) -> None:
        """Write the command for `names`, packed here: the link reads its answers itself (`Replies`, `_handle`),
        and redis-py's own (un)subscribe kept a dictionary of the channels it never used, and wrapped each
        write in its retry and instrumentation."""
        connection = pubsub.connection
        try:
            if self.sharded:  # one command per channel: a command's shard channels must share a slot
                packed = connection.pack_commands([(command, name) for name in names])
            else:
                packed = connection.pack_command(command, *names)
            connection.send_packed_command(packed, check_health=False)
        except CONNECTION_ERRORS as error:
            self.lost(pubsub, type(error).__name__)
        except BaseException:  # interrupted mid-write (a killed greenlet): the stream may hold half a command
            self.lost(pubsub, "interrupted write")
            raise

    # Any greenlet.

    def lost(self, pubsub, reason: str) -> None:
        """Forget a connection (idempotent): waiters for its confirmations try again on the next one."""
        if pubsub is not None and pubsub is self.pubsub:
            log.warning("event hub lost redis%s (%s); reconnecting", self._where(), reason)
            self.pubsub = None
            self.connected.clear()
            self.live.clear()
            self.unsubscribing.clear()
            self.pending.clear()  # the new connection holds none of them
            self.resync_after.clear()
            unconfirmed, self.unconfirmed = self.unconfirmed, defaultdict(deque)
            for confirmation in (c for queue in unconfirmed.values() for c in queue):
                confirmation.settle(live=False)
        if pubsub is not None:
            with contextlib.suppress(Exception):  # the connection may already be broken
                pubsub.close()

    def silent_for(self) -> float:
        """Seconds the current connection has been quiet: its listener waiting for Redis, with nothing
        received. 0 while the listener is busy with what Redis sent (a long fan-out, thousands of
        confirmations), or when Redis's answer is in the socket already and the listener has not been
        scheduled yet (a worker saturated by a storm): the link is then busy, not silent."""
        since = self.idle_since
        if since is None or self.pubsub is None:
            return 0.0
        return 0.0 if self._unread() else max(0.0, time.monotonic() - since)

    def _unread(self) -> bool:
        """Whether bytes from Redis wait in the connection's socket (checked without reading or yielding)."""
        sock = getattr(getattr(self.pubsub, "connection", None), "_sock", None)
        try:
            if hasattr(sock, "pending") and sock.pending():  # TLS: decrypted bytes held above the socket
                return True
            poller = _real_poll()
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (AttributeError, OSError, ValueError):  # no socket (yet, or any more)
            return False

    def _where(self) -> str:
        """' at host:port (REDIS_URL)': the node, for the log (never credentials)."""
        return " at " + describe_redis(self.node)

    # The listener greenlet.

    def _run(self) -> None:
        delay = BACKOFF_START
        while True:
            pubsub = None
            reason = "connection closed"
            try:
                pubsub = self.hub.topology.connect(self.node).pubsub()
                pubsub.connection = pubsub.connection_pool.get_connection()  # connect outside the hub's lock
                self.hub.topology.check_node(pubsub.connection)  # channels are never carried on a replica
                replies = Replies(pubsub.connection)
                self._attach(pubsub)
                while self.pubsub is pubsub:
                    self.idle_since = time.monotonic()
                    response = replies.next()
                    self.idle_since = None
                    events = []  # what Redis has sent already, handed to the hub together
                    while response is not None and self.pubsub is pubsub:
                        if response[0] in EVENT_KINDS:
                            events.append((response[1], response[2]))
                        else:
                            self.hub.deliver_all(events)
                            events = []
                            if self.pubsub is not pubsub:  # lost while the fan-out yielded: the answer is stale
                                break
                            if self._handle(response[0], response[1]):  # every channel subscribed again
                                if delay > BACKOFF_START:
                                    log.warning(
                                        "event hub reconnected to redis%s; subscribers resynchronise", self._where()
                                    )
                                delay = BACKOFF_START
                        if len(events) >= BATCH_LIMIT:
                            break
                        response = replies.buffered()
                    self.hub.deliver_all(events)
                    next_turn()  # a backlog is fanned out batch by batch, with requests running in between
            except LINK_ERRORS as error:
                reason = type(error).__name__ + (f": {error}" if isinstance(error, redis.ResponseError) else "")
            finally:
                self.idle_since = None
                self.lost(pubsub, reason)
            if self.hub.relocate(self):  # no channel left here (moved to other nodes, or no reader): done
                return
            gevent.sleep(delay)
            delay = min(delay * 2, self.hub.topology.backoff_cap)

    def _attach(self, pubsub) -> None:
        """Make `pubsub` the connection and subscribe it to every channel the hub places here."""
        with self.hub.lock:
            self.pubsub = pubsub
            names = self.hub.names_on(self)
            if names:
                self.send_subscribe(names, resync=True)
            if self.pubsub is pubsub:  # the write may have failed
                self.connected.set()
                self.hub.changed()

    def _handle(self, kind: str, name: str) -> bool:
        """Act on one (un)subscription answer from Redis (events go to the hub in batches, from `_run`); True
        when it completes a batch of subscriptions (after a loss)."""
        if kind in SUBSCRIBED_KINDS:
            queue = self.unconfirmed.get(name)
            if not queue:  # asked on a connection given up since: its waiters were told already
                return False
            confirmation = queue.popleft()
            if not queue:
                del self.unconfirmed[name]
            confirmation.settle(live=True)
            batch = self.resync_after.pop(confirmation, None)
            if batch is not None:
                self.hub.resync(*batch)
                return True
        elif kind in UNSUBSCRIBED_KINDS:
            if self.unsubscribing[name] > 0:
                self.unsubscribing[name] -= 1
            else:  # not asked for: Redis dropped the channel because its slot moved (resharding, failover)
                self.hub.dropped(self, name)
            if not self.unsubscribing[name]:
                del self.unsubscribing[name]
        return False
