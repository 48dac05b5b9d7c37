"""Carrying a reloaded worker's open SSE streams over to the workers that replace it, so clients stay connected.

On a reload (SIGHUP) gunicorn starts new workers and stops the old ones. Ended streams would come back all
at once, each paying for a new connection, a request and a catch-up: 20,000 took the two new workers 37-53 s
of CPU here. Instead, an old worker passes each parked stream's connection (the descriptor itself, over a
Unix socket) to a new worker with what it needs to go on: who reads, the cursor after the last event
written, the response's framing and the connection's lease. The new worker follows from that cursor as a
resuming reader does (its session checked again, what was published meanwhile read from history) and parks
the stream. The client sees a pause, not a reconnection, and reads every event once.

Only the master knows a reload from a stop: it counts reloads in the `generation` file of a directory
private to this gunicorn (gunicorn.conf.py). A worker listens at `<generation>-<pid>.sock` there; a stopping
worker of an older generation waits briefly for the new generation's sockets and hands its streams over
round-robin. Anything not carried (a stream with named channels, a WebSocket, one being written to, no new
worker in time) ends as before, and its client resumes by cursor.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import socket
import struct
import time

import gevent
import gevent.pool
import gevent.socket

from ..auth.guards import Caller
from ..metrics import OPEN_CONNECTIONS
from .follow import Follower, StreamEnded
from .handover import HANDLER_POOLS
from .parked import FAREWELL_REASONS, ParkedStream, chunk
from .sse import farewell, sse_outlet

log = logging.getLogger(__name__)

DIRECTORY_ENV = "AUTH_RT_CARRY_DIR"
GENERATION_FILE = "generation"
STATE_VERSION = 1
BATCH = 200  # streams per message: below the kernel's 253 descriptors per message
MESSAGE_BYTES = 1 << 20  # a batch's states (a plain stream's is about 300 bytes)
ADOPTING_AT_ONCE = 256  # adoptions under way per worker: each holds a round trip to Redis


def read_generation(directory: str) -> int:
    """How many reloads the master has begun (gunicorn.conf.py writes it; 0 when missing or unreadable)."""
    try:
        with open(os.path.join(directory, GENERATION_FILE)) as file:
            return int(file.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def socket_path(directory: str, generation: int, pid: int) -> str:
    """Where a worker of `generation` takes streams."""
    return os.path.join(directory, f"{generation}-{pid}.sock")


def sockets_of(directory: str, generation: int, other_than: int) -> list[str]:
    """The listening sockets of a generation's workers, the worker `other_than` left out."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        gen, _, rest = name.partition("-")
        pid = rest.removesuffix(".sock")
        if gen == str(generation) and rest.endswith(".sock") and pid.isdigit() and int(pid) != other_than:
            found.append(os.path.join(directory, name))
    return sorted(found)


def parent_of(pid: int) -> int | None:
    """A process's parent, from /proc (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return int(file.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def is_sibling(conn: socket.socket) -> bool:
    """Whether the peer of a Unix connection is another worker of this gunicorn: same user, same master."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid == os.getuid() and pid != os.getpid() and parent_of(pid) == os.getppid()


@dataclasses.dataclass
class Carried:
    """What a new worker needs to go on with a stream: the state sent beside its descriptor."""

    user_id: str
    role: str
    session_id: str
    token_version: int
    expires_at: int
    via: str
    cursor: str
    chunked: bool
    lease: str | None
    family: int

    @classmethod
    def of(cls, stream: ParkedStream) -> Carried:
        """A parked stream's state, taken off the hub (`take_carriable`)."""
        caller, follower = stream.follower.caller, stream.follower
        return cls(
            caller.user_id, caller.role, caller.session_id, caller.token_version, caller.expires_at, caller.via,
            follower.cursor, stream.chunked, follower.lease, stream.sock.family,
        )  # fmt: skip

    def caller(self) -> Caller:
        """The stream's caller, as its token's claims say (the stored user is read again in the adoption)."""
        return Caller(self.user_id, self.role, self.session_id, self.token_version, self.expires_at, self.via, {})


def carriable(stream) -> bool:
    """A parked SSE stream at rest: nothing queued, nothing half-written, no named channels."""
    if not isinstance(stream, ParkedStream) or stream.serving or stream.done or stream.outlet.stalled:
        return False
    follower = stream.follower
    return follower.subscription is not None and not follower.access and follower.idle()


def take_carriable(hub) -> list[ParkedStream]:
    """Take every carriable stream off the hub and the parking (nothing is written to them after this)."""
    taken = []
    for subscriptions in list(hub.by_session.values()):
        for subscription in list(subscriptions):
            stream = subscription.parked
            if carriable(stream):
                stream.done = True  # the parking's timer and the hub leave it alone from now on
                stream.stop_watching()
                subscription.outlet = subscription.parked = None
                hub.unsubscribe(subscription)
                stream.follower.subscription = None
                taken.append(stream)
    return taken


class AdoptedPlace:
    """An adopted connection's place in the worker's handler pool, as a handed-over one keeps (handover.py)."""

    __slots__ = ("pool",)

    def __init__(self, pool: gevent.pool.Pool):
        self.pool = pool
        pool.add(self, blocking=False)

    def release(self) -> None:
        """The connection is closed: its place is free."""
        self.pool.discard(self)


class CarryOver:
    """This worker's side of carrying streams over: adopting them from an older generation, handing its own
    on to a newer one."""

    def __init__(self, app, directory: str, generation: int):
        self.app = app
        self.directory = directory
        self.generation = generation
        self.listener: gevent.socket.socket | None = None
        self.path = socket_path(directory, generation, os.getpid())
        # Received at once (the old worker must be done before its graceful time-out), adopted a few at a time.
        self.waiting: collections.deque[tuple[dict, int]] = collections.deque()
        self.adopters = 0

    @classmethod
    def from_environ(cls, app) -> CarryOver | None:
        """None outside gunicorn with this project's configuration (no carry-over directory)."""
        directory = os.environ.get(DIRECTORY_ENV)
        if not directory or not os.path.isdir(directory):
            return None
        return cls(app, directory, read_generation(directory))

    # Adopting (the new worker).

    def listen(self) -> None:
        """Take streams from older workers; the socket appears once the worker serves (its pool exists)."""
        gevent.spawn(self._listen)

    def _listen(self) -> None:
        listener = gevent.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(self.path + ".new")
        os.chmod(self.path + ".new", 0o600)
        listener.listen(16)
        os.replace(self.path + ".new", self.path)  # seen by the old workers only once it accepts
        self.listener = listener
        while self.listener is not None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            gevent.spawn(self._receive, conn)

    def stop_adopting(self) -> None:
        """This worker stops too: no stream is handed to it from now on."""
        listener, self.listener = self.listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            listener.close()

    def _receive(self, conn) -> None:
        """Adopt the batches one older worker sends; refused whole from a process that is not a sibling worker."""
        with conn:
            sibling = None
            while True:
                try:
                    data, fds, flags, _ = socket.recv_fds(conn, MESSAGE_BYTES, BATCH)
                except OSError:
                    return
                if sibling is None:
                    sibling = is_sibling(conn)
                states = self._states(data, fds, flags) if sibling else None
                if states is None:
                    for fd in fds:
                        os.close(fd)
                    if not sibling:
                        log.warning("carry-over: refused connections from a process not a worker of this server")
                        return
                    continue
                if not data:
                    return
                self.waiting.extend(zip(states, fds, strict=True))
                while self.adopters < min(ADOPTING_AT_ONCE, len(self.waiting)):
                    self.adopters += 1
                    gevent.spawn(self._adopt_waiting)

    @staticmethod
    def _states(data: bytes, fds: list[int], flags: int) -> list[dict] | None:
        """A batch's states, one per descriptor; None for a batch cut short or of another version."""
        if not data:
            return [] if not fds else None
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            log.warning("carry-over: a batch arrived cut short; its %d connections are closed", len(fds))
            return None
        try:
            message = json.loads(data)
            states = message["streams"] if message.get("v") == STATE_VERSION else None
        except (ValueError, KeyError, AttributeError, TypeError):
            states = None
        if not isinstance(states, list) or len(states) != len(fds):
            log.warning("carry-over: a batch this worker does not read; its %d connections are closed", len(fds))
            return None
        return states

    def _adopt_waiting(self) -> None:
        try:
            while self.waiting:
                self.adopt(*self.waiting.popleft())
        finally:
            self.adopters -= 1

    def adopt(self, state: dict, fd: int) -> None:
        """Go on with a carried stream: follow from its cursor (session checked, history read) and park it."""
        app = self.app
        try:
            carried = Carried(**state)
            sock = gevent.socket.socket(carried.family, socket.SOCK_STREAM, 0, fileno=fd)
        except (TypeError, ValueError, OSError):
            os.close(fd)
            return
        pools = [pool for pool in HANDLER_POOLS if pool.free_count() > 0]
        if not pools:
            sock.close()  # a full worker: the client reconnects to one with room
            return
        settings, leases = app.config["SETTINGS"], app.extensions["connection_leases"]
        if carried.lease:
            leases.hold(carried.lease, carried.user_id)
        try:
            follower = Follower(
                app.extensions["event_bus"], app.extensions["event_hub"], carried.caller(), carried.cursor,
                settings.ws_send_queue, leases, carried.lease,
            )  # fmt: skip
        except StreamEnded as ended:
            self._end(sock, carried, ended.reason)
            return
        except Exception as error:  # noqa: BLE001 - Redis away, a malformed state: the client resumes elsewhere
            log.warning("carry-over: a stream could not be adopted (%s); its client reconnects", type(error).__name__)
            leases.release(carried.lease)
            sock.close()
            return
        if follower.user["role"] != carried.role:  # the stored role decides the channels: reopened the verified way
            follower.close()
            sock.close()
            return
        follower.caller = dataclasses.replace(follower.caller, user=follower.user)
        parking = app.extensions["parked_streams"]
        outlet = sse_outlet(follower, sock, carried.chunked, settings.ws_send_timeout)
        OPEN_CONNECTIONS.labels("sse").inc()

        def finish() -> None:
            OPEN_CONNECTIONS.labels("sse").dec()
            follower.close()

        place = AdoptedPlace(max(pools, key=lambda pool: pool.free_count()))
        parking.add(ParkedStream(parking, follower, outlet, place, carried.chunked, [finish]))

    @staticmethod
    def _end(sock, carried: Carried, reason: str) -> None:
        """End a stream whose session ended while it was carried over: say why, as the stream would have."""
        message = farewell(reason) if reason in FAREWELL_REASONS else b""
        with contextlib.suppress(OSError):
            sock.sendall(((chunk(message) if message else b"") + b"0\r\n\r\n") if carried.chunked else message)
        sock.close()

    # Handing on (the old worker).

    def hand_on(self, deadline: float, expected: int) -> int:
        """The worker is stopping: hand its parked streams to the new generation's workers, if this is a
        reload and they are listening by `deadline` (monotonic; all `expected` of them, or those there by
        then). Returns how many streams were carried; the rest end as before."""
        newest = read_generation(self.directory)
        if newest <= self.generation:
            return 0  # a stop, not a reload
        successors = self._wait_for_successors(newest, deadline, expected)
        if not successors:
            log.warning("carry-over: no new worker listening in time; streams end and their clients reconnect")
            return 0
        streams = take_carriable(self.app.extensions["event_hub"])
        shares: dict[str, list[ParkedStream]] = {path: [] for path in successors}
        for path, stream in zip(itertools.cycle(successors), streams):
            shares[path].append(stream)
        sending = [gevent.spawn(self._send, path, share) for path, share in shares.items()]
        gevent.joinall(sending)
        carried = sum(greenlet.value or 0 for greenlet in sending)
        log.info("carry-over: %d of %d streams handed to %d new workers", carried, len(streams), len(successors))
        return carried

    def _wait_for_successors(self, generation: int, deadline: float, expected: int) -> list[str]:
        found: list[str] = []
        while time.monotonic() < deadline:
            found = sockets_of(self.directory, generation, other_than=os.getpid())
            if len(found) >= expected:
                break
            gevent.sleep(0.05)  # a new worker is still loading the app: nothing to wait on but its socket file
        return found

    def _send(self, path: str, streams: list[ParkedStream]) -> int:
        """Send `streams` to the worker at `path`, a batch per message; those not sent end (their clients
        reconnect). Returns how many were sent."""
        leases = self.app.extensions["connection_leases"]
        sent = 0
        try:
            with gevent.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.connect(path)
                for start in range(0, len(streams), BATCH):
                    batch = streams[start : start + BATCH]
                    states = {"v": STATE_VERSION, "streams": [dataclasses.asdict(Carried.of(s)) for s in batch]}
                    socket.send_fds(conn, [json.dumps(states).encode()], [s.sock.fileno() for s in batch])
                    for stream in batch:  # the new worker holds the connection and its lease now
                        leases.hand_off(stream.follower.lease)
                        stream.follower.lease = None
                        stream.close()
                    sent += len(batch)
        except OSError as error:
            log.warning("carry-over: handing streams to %s failed (%s); they end", path, type(error).__name__)
        for stream in streams[sent:]:
            stream.close()
        return sent
