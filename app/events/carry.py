"""Carrying a reloaded worker's open SSE streams over to the workers that replace it, so clients stay connected.

On a reload (SIGHUP) gunicorn starts new workers and stops the old ones. Ended streams would come back all
at once, each paying for a new connection, a request and a catch-up: 20,000 kept the two new workers busy
for 37-53 s here. Instead, an old worker passes each parked stream's connection (the descriptor itself, over a
Unix socket) to a new worker with what it needs to go on: who reads, the cursor after the last event
written, the response's framing and the connection's lease. The new worker follows from that cursor as a
resuming reader does (its session checked again, what was published meanwhile read from history) and parks
the stream. The client sees a pause, not a reconnection, and reads every event once.

Only the master knows a reload from a stop: it counts reloads in the `generation` file of a directory
private to this gunicorn (gunicorn.conf.py). A worker listens at `<generation>-<pid>.sock` there; a stopping
worker of an older generation waits for the new generation's sockets, shares its streams among them and
sends them a batch at a time, each once the one before is adopted: a stream waiting for its turn is still
served here, so each pauses only for its own batch; one with events still queued at its turn is tried
again after the others. Anything not carried (a stream with named channels, a WebSocket, one that does not
come to rest, no new worker in time) ends as before, and its client resumes by cursor.
"""

from __future__ import annotations

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
from ..errors import REDIS_UNAVAILABLE
from ..metrics import OPEN_CONNECTIONS
from .follow import Follower, StreamEnded
from .handover import HANDLER_POOLS
from .parked import FAREWELL_REASONS, ParkedStream, chunk
from .sse import farewell, sse_outlet

log = logging.getLogger(__name__)

GENERATION_FILE = "generation"
STATE_VERSION = 1
BATCH = 200  # streams per message: below the kernel's 253 descriptors per message
MESSAGE_BYTES = 1 << 20  # a batch's states (a plain stream's is about 300 bytes)
# A stream not at rest at its turn (events queued for it, a client reading slowly) is tried again once the
# others have gone, every AGAIN_EVERY s for at most AGAIN_FOR s: on a machine behind with its deliveries,
# a third of the streams were not at rest at their turn, and each would have sent its client back.
AGAIN_EVERY = 0.5
AGAIN_FOR = 10.0


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


def sibling(conn: socket.socket) -> int | None:
    """The pid of a Unix connection's peer if it is another worker of this gunicorn (same user, same master)."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid if uid == os.getuid() and pid != os.getpid() and parent_of(pid) == os.getppid() else None


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
        """A parked stream's state, once taken off the hub (`take`)."""
        caller, follower = stream.follower.caller, stream.follower
        return cls(
            caller.user_id, caller.role, caller.session_id, caller.token_version, caller.expires_at, caller.via,
            follower.cursor, stream.chunked, follower.lease, stream.sock.family,
        )  # fmt: skip

    def caller(self) -> Caller:
        """The stream's caller, as its token's claims say (the stored user is read again in the adoption)."""
        return Caller(self.user_id, self.role, self.session_id, self.token_version, self.expires_at, self.via, {})


def carriable(stream) -> bool:
    """A parked SSE stream another worker can go on with: still open, and no named channels."""
    if not isinstance(stream, ParkedStream) or stream.done:
        return False
    return stream.follower.subscription is not None and not stream.follower.access


def at_rest(stream: ParkedStream) -> bool:
    """Nothing queued for the stream, nothing half-written to it: taken now, it misses nothing."""
    return not stream.serving and not stream.outlet.stalled and stream.follower.idle()


def parked_streams(hub) -> list[ParkedStream]:
    """This worker's parked SSE streams."""
    return [
        subscription.parked
        for subscriptions in hub.by_session.values()
        for subscription in subscriptions
        if isinstance(subscription.parked, ParkedStream)
    ]


def take(stream: ParkedStream) -> bool:
    """Take a stream off the hub and the parking if it is carriable and at rest: nothing is written to it after
    this."""
    if not (carriable(stream) and at_rest(stream)):
        return False
    subscription = stream.follower.subscription
    stream.done = True  # the parking's timer and the hub leave it alone from now on
    stream.stop_watching()
    subscription.outlet = subscription.parked = None
    stream.follower.hub.unsubscribe(subscription)
    stream.follower.subscription = None
    return True


class PoolPlace:
    """A place in the worker's handler pool held by something other than a handler: an adopted connection (as a
    handed-over one keeps its own, handover.py), or a stopping worker's handing on of its streams (gunicorn's
    stopping worker ends once its pools are empty)."""

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

    @classmethod
    def for_app(cls, app) -> CarryOver | None:
        """None outside gunicorn with this project's configuration (no carry-over directory in the settings)."""
        directory = app.config["SETTINGS"].carry_dir
        if not directory or not os.path.isdir(directory):
            return None
        return cls(app, directory, read_generation(directory))

    # Adopting (the new worker).

    def listen(self) -> None:
        """Take streams from older workers; the socket appears once the worker serves (its pool exists)."""
        gevent.spawn(self._listen)

    def _listen(self) -> None:
        listener = gevent.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            listener.bind(self.path + ".new")
            os.chmod(self.path + ".new", 0o600)
            listener.listen(16)
            os.replace(self.path + ".new", self.path)  # seen by the old workers only once it accepts
        except OSError as error:
            log.warning("carry-over: this worker takes no streams on a reload (%s: %s)", self.path, error)
            listener.close()
            return
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
        """Adopt the batches one older worker sends, answering each once it is adopted; refused whole from a
        process that is not a sibling worker."""
        since, received, adopted, peer = time.monotonic(), 0, 0, None
        with conn:
            while True:
                try:
                    data, fds, flags, _ = socket.recv_fds(conn, MESSAGE_BYTES, BATCH)
                except OSError:
                    break
                if peer is None:
                    peer = sibling(conn)
                states = self._states(data, fds, flags) if peer else None
                if states is None:
                    for fd in fds:
                        os.close(fd)
                    if not peer:
                        log.warning("carry-over: refused connections from a process not a worker of this server")
                        return
                    continue
                if not data:
                    break
                adopting = [gevent.spawn(self.adopt, state, fd) for state, fd in zip(states, fds, strict=True)]
                gevent.joinall(adopting)
                received += len(fds)
                adopted += sum(1 for greenlet in adopting if greenlet.value)
                try:
                    conn.send(b"%d" % adopted)  # the sender's turn to send the next batch
                except OSError:
                    break
        took = time.monotonic() - since
        log.info("carry-over: adopted %d of %d streams from pid %s in %.1f s", adopted, received, peer, took)

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

    def adopt(self, state: dict, fd: int) -> bool:
        """Go on with a carried stream: follow from its cursor (session checked, history read) and park it.
        False when it ends instead (its client then reconnects, or learns that its session ended)."""
        app = self.app
        try:
            carried = Carried(**state)
            sock = gevent.socket.socket(carried.family, socket.SOCK_STREAM, 0, fileno=fd)
        except (TypeError, ValueError, OSError):
            os.close(fd)
            return False
        pools = [pool for pool in HANDLER_POOLS if pool.free_count() > 0]
        if not pools:
            sock.close()  # a full worker: the client reconnects to one with room
            return False
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
            return False
        except Exception as error:  # noqa: BLE001 - Redis away, a malformed state: the client resumes elsewhere
            what = "carry-over: a stream could not be adopted (its client reconnects)"
            if isinstance(error, REDIS_UNAVAILABLE):  # a reload during an outage: a line a minute, not one a stream
                app.extensions["parked_streams"].failures.failed(what, error)
            else:
                log.warning("%s: %s", what, type(error).__name__)
            leases.release(carried.lease)
            sock.close()
            return False
        follower.caller = dataclasses.replace(follower.caller, user=follower.user)
        parking = app.extensions["parked_streams"]
        outlet = sse_outlet(follower, sock, carried.chunked, settings.ws_send_timeout)
        OPEN_CONNECTIONS.labels("sse").inc()

        def finish() -> None:
            OPEN_CONNECTIONS.labels("sse").dec()
            follower.close()

        place = PoolPlace(max(pools, key=lambda pool: pool.free_count()))
        parking.add(ParkedStream(parking, follower, outlet, place, carried.chunked, [finish]))
        return True

    @staticmethod
    def _end(sock, carried: Carried, reason: str) -> None:
        """End a stream whose session ended while it was carried over: say why, as the stream would have."""
        message = farewell(reason) if reason in FAREWELL_REASONS else b""
        with contextlib.suppress(OSError):
            sock.sendall(((chunk(message) if message else b"") + b"0\r\n\r\n") if carried.chunked else message)
        sock.close()

    # Handing on (the old worker).

    def reloading(self) -> bool:
        """Whether the master began a reload since this worker started (or this is a stop)."""
        return read_generation(self.directory) > self.generation

    def hand_on(self, deadline: float, expected: int) -> int:
        """The worker is stopping: hand its parked streams to the new generation's workers, if this is a
        reload and they listen in time (all `expected` of them, or those there by the deadline, monotonic).
        Returns how many streams were carried; the rest end as before, once this returns."""
        if not self.reloading():
            return 0
        successors = self._wait_for_successors(read_generation(self.directory), deadline, expected)
        if not successors:
            log.warning("carry-over: no new worker listening in time; streams end and their clients reconnect")
            return 0
        streams = parked_streams(self.app.extensions["event_hub"])
        shares: dict[str, list[ParkedStream]] = {path: [] for path in successors}
        for path, stream in zip(itertools.cycle(successors), streams, strict=False):
            shares[path].append(stream)
        # gunicorn's stopping worker ends once its handler pools are empty, which the last streams sent leave them
        # before the new workers answer: a place held meanwhile keeps the worker until the answer and this line.
        places = [PoolPlace(pool) for pool in HANDLER_POOLS[:1] if pool.free_count() > 0]
        try:
            sending = [gevent.spawn(self._send, path, share, deadline) for path, share in shares.items()]
            gevent.joinall(sending)
            carried = sum(greenlet.value or 0 for greenlet in sending)
            log.info("carry-over: %d of %d streams handed to %d new workers", carried, len(streams), len(successors))
        finally:
            for place in places:
                place.release()
        return carried

    def _wait_for_successors(self, generation: int, deadline: float, expected: int) -> list[str]:
        found: list[str] = []
        while time.monotonic() < deadline:
            found = sockets_of(self.directory, generation, other_than=os.getpid())
            if len(found) >= expected:
                break
            gevent.sleep(0.05)  # a new worker is still loading the app: nothing to wait on but its socket file
        return found

    def _send(self, path: str, streams: list[ParkedStream], deadline: float) -> int:
        """Send `streams` to the worker at `path` a batch at a time, each once the one before is adopted: a
        stream waits in this worker, still served, until its turn, and goes on after a pause of one batch's
        adoption. Those not at rest at their turn are tried again after the others (AGAIN_EVERY, AGAIN_FOR).
        Returns how many were sent; those not sent by the deadline stay (and end after this)."""
        sent, waiting, again_until = 0, streams, None
        try:
            with gevent.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.connect(path)
                while waiting:
                    busy: list[ParkedStream] = []
                    for start in range(0, len(waiting), BATCH):
                        if time.monotonic() >= deadline:
                            return sent
                        turn = waiting[start : start + BATCH]
                        batch = [stream for stream in turn if take(stream)]
                        busy += [stream for stream in turn if carriable(stream)]  # not taken: not at rest
                        if batch and not self._send_batch(conn, batch, deadline):
                            return sent + len(batch)  # the new worker went away
                        sent += len(batch)
                    waiting = busy
                    again_until = again_until or time.monotonic() + AGAIN_FOR
                    if waiting and time.monotonic() + AGAIN_EVERY < min(again_until, deadline):
                        log.info("carry-over: %d stream(s) not at rest at their turn; tried again", len(waiting))
                        gevent.sleep(AGAIN_EVERY)  # their queues drain meanwhile: nothing to wait on but time
                    else:
                        break
        except OSError as error:
            log.warning("carry-over: handing streams to %s failed (%s); the rest end", path, type(error).__name__)
        return sent

    def _send_batch(self, conn, batch: list[ParkedStream], deadline: float) -> bool:
        """Send streams taken off the hub with their states, and wait for the new worker's answer; False if it
        went away (the streams are its own once sent)."""
        leases = self.app.extensions["connection_leases"]
        states = {"v": STATE_VERSION, "streams": [dataclasses.asdict(Carried.of(s)) for s in batch]}
        try:
            socket.send_fds(conn, [json.dumps(states).encode()], [s.sock.fileno() for s in batch])
        except OSError:
            for stream in batch:  # taken off the hub already: closed, their clients reconnect
                stream.close()
            raise
        for stream in batch:  # the new worker holds the connection and its lease now
            leases.hand_off(stream.follower.lease)
            stream.follower.lease = None
            stream.close()
        with gevent.Timeout(max(0.0, deadline - time.monotonic()), False):
            return bool(conn.recv(32))
        return True  # no answer by the deadline: this worker stops sending
