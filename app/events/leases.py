"""A cap on each user's live connections (SSE, WebSocket, held long polls), counted in Redis.

Every live connection holds a lease: a member of the user's sorted set, scored by when it lapses.
Workers renew the leases of their connections every RENEW_INTERVAL seconds (a slice of their users each
second), so a connection of a worker that died without cleaning up stops counting once its lease lapses, on
every instance alike.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from typing import NamedTuple

import gevent
import redis

from ..errors import ApiError
from ..redis import Failures, Keys, Outage, shared_pipelines
from .links import next_turn

log = logging.getLogger(__name__)

LEASE_SECONDS = 60
RENEW_INTERVAL = 20  # seconds between two renewals of a lease
RENEW_SLICES = 20  # the users whose leases are renewed together (by their id's hash), one slice at a time
RENEW_CHUNK = 200  # users whose leases are renewed in one pipeline (a few milliseconds of a worker's loop)

# KEYS[1] the user's leases. ARGV: now, lapse time, limit, lease id, key ttl.
# Drop lapsed leases, then take one if the user is under the limit: one atomic step.
ACQUIRE_LUA = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


class TooManyConnections(ApiError):
    """429: the user already holds MAX_CONNECTIONS_PER_USER live connections."""

    def __init__(self, limit: int):
        super().__init__(
            429,
            "too_many_connections",
            f"At most {limit} live connections per user; close one and retry.",
            {"Retry-After": "5"},
        )


class LeaseAsked(NamedTuple):
    """A lease asked for: its id, its user, and the script call (script, keys, arguments) that takes it."""

    lease_id: str
    user_id: str
    call: tuple


class ConnectionLeases:
    """This process's leases: taken when a connection opens, renewed together, dropped when it ends."""

    def __init__(self, client: redis.Redis, limit: int, redis_url: str = ""):
        """`redis_url`: where `client` connects (REDIS_URL), for the log lines of an outage."""
        self.client = client
        self.limit = limit
        self.held: dict[str, str] = {}  # lease id -> user id
        self._acquire = client.register_script(ACQUIRE_LUA)
        # Connections that end together (a reload's old workers, clients leaving after a storm) give their
        # leases back in shared round trips, not in one each.
        self._send = shared_pipelines(client)
        self._renewer: gevent.Greenlet | None = None
        self._renewing = Outage(log, "renewing connection leases", redis_url)
        self._releasing = Failures(log, redis_url)  # connections ending together during an outage make one line

    def acquire(self, user_id: str) -> str:
        """A new lease for one of the user's connections, or TooManyConnections (429)."""
        asked = self.ask(user_id)
        script, keys, args = asked.call
        return self.granted(asked, script(keys=keys, args=args))

    def ask(self, user_id: str) -> LeaseAsked:
        """A lease to ask for in a round trip that carries more (a reader's first reads): see `granted`."""
        lease_id, now = uuid.uuid4().hex, time.time()
        args = [f"{now:.3f}", f"{now + LEASE_SECONDS:.3f}", self.limit, lease_id, LEASE_SECONDS]
        return LeaseAsked(lease_id, user_id, (self._acquire, [Keys.connection_leases(user_id)], args))

    def granted(self, asked: LeaseAsked, answer) -> str:
        """The lease asked for, held from now on, given the acquiring script's answer; or TooManyConnections."""
        if not answer:
            raise TooManyConnections(self.limit)
        self.hold(asked.lease_id, asked.user_id)
        return asked.lease_id

    def hold(self, lease_id: str, user_id: str) -> None:
        """Hold a lease taken (here, or by the worker a connection was carried over from: carry.py) and renew it."""
        self.held[lease_id] = user_id
        if self._renewer is None or self._renewer.dead:
            self._renewer = gevent.spawn(self._renew_forever)

    def hand_off(self, lease_id: str | None) -> None:
        """Stop holding a lease without giving it back: its connection went to another worker, which holds it."""
        if lease_id:
            self.held.pop(lease_id, None)

    def withdraw(self, asked: LeaseAsked) -> None:
        """Give back a lease asked for whose answer never came (the round trip failed): it may have been taken."""
        self.held[asked.lease_id] = asked.user_id
        self.release(asked.lease_id)

    def release(self, lease_id: str | None) -> None:
        """Give a lease back (idempotent); if Redis is away, the lease lapses by itself."""
        user_id = self.held.pop(lease_id, None) if lease_id else None
        if user_id is None:
            return
        try:
            (answer,) = self._send([("zrem", (Keys.connection_leases(user_id), lease_id), {})])
        except redis.exceptions.RedisError as error:
            answer = error
        if isinstance(answer, Exception):
            self._releasing.failed(f"releasing a connection lease (it lapses in {LEASE_SECONDS} s)", answer)

    def renew(self, part: int | None = None) -> None:
        """Push the held leases' lapse time forward: every lease, or (given `part`) those of the users in that
        slice of RENEW_SLICES; a pipeline for each RENEW_CHUNK users, with every other greenlet's turn in
        between. A lease given back meanwhile is not taken again (ZADD XX updates members only)."""
        by_user: dict[str, dict[str, float]] = defaultdict(dict)
        lapse = time.time() + LEASE_SECONDS
        for lease_id, user_id in list(self.held.items()):
            if part is None or hash(user_id) % RENEW_SLICES == part:
                by_user[user_id][lease_id] = lapse
        users = list(by_user.items())
        for start in range(0, len(users), RENEW_CHUNK):
            if start:
                next_turn()
            pipe = self.client.pipeline(transaction=False)
            for user_id, leases in users[start : start + RENEW_CHUNK]:
                pipe.zadd(Keys.connection_leases(user_id), leases, xx=True)
                pipe.expire(Keys.connection_leases(user_id), LEASE_SECONDS)
            pipe.execute()

    def _renew_forever(self) -> None:
        """A slice of the users' leases every RENEW_INTERVAL / RENEW_SLICES seconds, each slice every RENEW_INTERVAL.
        All at once, a worker holding 5,000 streams spent about 150 ms of CPU every 20 s on them, and a busy
        worker's events waited behind it (the rooms run's slowest percent of deliveries fell in those moments)."""
        part = 0
        while self.held:
            gevent.sleep(RENEW_INTERVAL / RENEW_SLICES)
            part = (part + 1) % RENEW_SLICES
            try:
                self.renew(part)
            except redis.exceptions.RedisError as error:
                self._renewing.failed(error)
            else:
                self._renewing.succeeded()
