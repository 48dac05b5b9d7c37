"""Writing a parked reader's events from the hub, without waking the reader's greenlet.

A live connection with nothing queued parks its greenlet and lends the hub an outlet. For each event
the hub then accepts it into the reader's position, frames it (the event's encoding is shared by all
its readers; only the cursor is the reader's own) and writes it to the socket with one non-blocking
send. The reader's greenlet wakes only when the socket would block (the rest of the frame is kept for
it to finish, within the send time-out), when the client is gone, or for what needs it anyway: a
resynchronisation, the end of the session, a heartbeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gevent
import gevent.socket

from .bus import Event
from .follow import Follower, StreamEnded


class Tally:
    """A counter's increments made by the hub in a burst (one per reader of an event), added to the
    counter once, when the burst is over: a Prometheus increment costs more than writing the event."""

    __slots__ = ("counter", "count")

    def __init__(self, counter):
        self.counter = counter
        self.count = 0

    def inc(self, by: int = 1) -> None:
        """Count `by`; the first of a burst schedules the flush."""
        if not self.count:
            gevent.get_hub().loop.run_callback(self.flush)  # runs once the hub's greenlet yields
        self.count += by

    def flush(self) -> None:
        """Add what was counted to the counter."""
        count, self.count = self.count, 0
        self.counter.inc(count)


class FellBehind(Exception):
    """A client that could not take a frame within the send time-out."""


def send_within(sock, data: bytes, deadline: float) -> None:
    """Write `data` whole to a gevent socket by `deadline` (monotonic), else FellBehind with the rest unsent.

    Waits for writability rather than setting a socket time-out: another greenlet may be in recv()
    on the same socket, and a time-out there would end the connection.
    """
    view = memoryview(data)
    while view:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FellBehind(bytes(view))
        try:
            gevent.socket.wait_write(sock.fileno(), timeout=remaining)
        except TimeoutError:
            raise FellBehind(bytes(view)) from None
        view = view[sock.send(view) :]


def plain_socket(sock):
    """The gevent socket of a plain TCP connection, or None (TLS, or no socket: a test client)."""
    return sock if type(sock) is gevent.socket.socket else None


class Outlet:
    """The hub's way to write a parked reader's events to its socket itself (see the module's docstring)."""

    __slots__ = ("follower", "sock", "raw", "frame", "delivered", "finish_rest", "busy", "unsent", "gone", "wrote_at")

    def __init__(
        self,
        follower: Follower,
        sock,
        frame: Callable[[Event, str], bytes],
        delivered,
        finish_rest: Callable[[bytes], None],
        busy: Callable[[], bool] | None = None,
    ):
        """`frame` makes the bytes of an event with the reader's cursor after it (OSError: the connection
        is over); `finish_rest` writes a frame's unsent rest from the reader's greenlet (raising
        FellBehind or OSError); `busy` says when the socket is being written elsewhere."""
        self.follower = follower
        self.sock = sock
        self.raw = sock._sock  # the non-blocking OS socket under gevent's: its send() never waits
        self.frame = frame
        self.delivered = delivered
        self.finish_rest = finish_rest
        self.busy = busy
        self.unsent = b""
        self.gone = False
        self.wrote_at = time.monotonic()

    @property
    def stalled(self) -> bool:
        """Whether the reader's greenlet must take over: a frame's rest to write, or the client gone."""
        return self.gone or bool(self.unsent)

    def write(self, event) -> bool:
        """Deliver one event now; False when it must be queued for the reader instead (socket busy)."""
        return self.write_all((event,))

    def write_all(self, events) -> bool:
        """Deliver events now, in one write; False when they must be queued for the reader (socket busy)."""
        if self.busy is not None and self.busy():
            return False
        advance, frame, frames = self.follower.advance, self.frame, []
        try:
            for event in events:
                cursor = advance(event)
                if cursor is not None:  # else delivered already (history and live overlap)
                    frames.append(frame(event, cursor))
            if not frames:
                return True
        except OSError:
            self.gone = True
            return True
        self.send(b"".join(frames))
        if not self.gone:
            self.delivered.inc(len(frames))
        return True

    def send(self, data: bytes) -> None:
        """Write `data` now, without waiting: what the socket does not take is left for finish()."""
        try:
            sent = self.raw.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self.gone = True
            return
        if sent < len(data):
            self.unsent = data[sent:]
        self.wrote_at = time.monotonic()

    def finish(self) -> None:
        """In the reader's greenlet after it wakes: write what the hub could not. StreamEnded when it cannot."""
        if self.gone:
            raise StreamEnded("gone")
        rest, self.unsent = self.unsent, b""
        if not rest:
            return
        try:
            self.finish_rest(rest)
        except FellBehind:
            raise StreamEnded("overflow") from None
        except OSError:
            self.gone = True
            raise StreamEnded("gone") from None
        self.wrote_at = time.monotonic()
