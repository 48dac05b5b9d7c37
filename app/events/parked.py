"""SSE streams parked without a greenlet, once gunicorn's handler has handed their connection over.

A parked stream is a small record: its follower, its outlet (through which the hub writes its events,
as for a waiting reader) and its socket. No request, environ, WSGI frames or greenlet stack stay
alive for it. One timer per worker writes the heartbeats of quiet streams and notices expired access
tokens; a watcher on its socket notices at once when the client leaves. A greenlet is spawned only for
what needs one: the rest of a frame the socket could not take at once, queued events, a
resynchronisation, the end. It parks the stream again when it is done.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections import defaultdict
from collections.abc import Callable

import gevent

from ..errors import REDIS_UNAVAILABLE
from ..redis import Failures
from .follow import Delivery, Follower, StreamEnded
from .handover import Handover
from .outlet import FellBehind, Outlet, send_within

log = logging.getLogger(__name__)

FAREWELL_REASONS = ("session_ended", "token_expired")  # an SSE event says why; other ends just close
SILENT_REASONS = ("gone", "overflow")  # nothing more is written: the client left or cannot keep up


def monotonic_expiry(caller) -> float:
    """When the caller's access token expires, on the monotonic clock."""
    return caller.expires_at - time.time() + time.monotonic()


def client_left(sock: socket.socket) -> bool:
    """Whether the client has closed its side (or reset the connection), as a peek sees it."""
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of the chunked transfer coding."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class ParkedStream:
    """One handed-over SSE stream (see the module's docstring)."""

    __slots__ = (
        "parking",
        "follower",
        "outlet",
        "sock",
        "readable",
        "handover",
        "chunked",
        "on_end",
        "serving",
        "done",
        "visit",
    )

    def __init__(self, parking: Parking, follower: Follower, outlet: Outlet, handover: Handover, chunked: bool, on_end):
        """`outlet` writes to the socket `handover` took; `on_end` runs once the connection is closed."""
        self.parking = parking
        self.follower = follower
        self.outlet = outlet
        self.sock = outlet.sock
        # An SSE client sends nothing after its request: its socket turning readable means it left. A
        # write to it would still be accepted, so without watching, only the heartbeat after next would fail.
        self.readable = gevent.get_hub().loop.io(outlet.raw.fileno(), 1)
        self.handover = handover
        self.chunked = chunked
        self.on_end: list[Callable[[], None]] = on_end
        self.serving = False
        self.done = False
        self.visit = 0  # the timer's tick at which it is due (an earlier entry for it is stale)

    def framed(self, data: bytes) -> bytes:
        """`data` in the response's framing."""
        return chunk(data) if self.chunked else data

    def park(self) -> None:
        """Lend the outlet to the hub and wait for the timer or the hub; at once if something waits."""
        subscription = self.follower.subscription
        subscription.parked = self
        if self.follower.pending or subscription.items or subscription.ended is not None:
            self.wake()
            return
        subscription.outlet = self.outlet
        self.parking.schedule(self)
        if self.readable is not None and not self.readable.active:
            self.readable.start(self.client_spoke)

    def client_spoke(self) -> None:
        """The watcher: the client closed its side, so the stream ends; or it sent something, which is
        left unread (as nginx does), and its leaving is noticed when a write fails."""
        self.stop_watching()
        if client_left(self.outlet.raw):
            self.outlet.gone = True
            self.wake()  # its greenlet ends it (giving its lease back is a Redis call)

    def stop_watching(self) -> None:
        """Stop watching the socket for good."""
        if self.readable is not None:
            self.readable.stop()
            self.readable.close()
            self.readable = None

    def wake(self) -> None:
        """Take the outlet back and spawn the stream's own greenlet: something needs it."""
        if not self.serving and not self.done:
            if self.readable is not None:
                self.readable.stop()
            self.serving = True
            self.follower.subscription.outlet = None
            gevent.spawn(self.serve)

    def serve(self) -> None:
        """Write what is queued, as a waiting reader would; park again, or end."""
        follower, parking = self.follower, self.parking
        try:
            while deliveries := follower.take_now(self.outlet):
                self.send(self.framed(parking.body(deliveries)))
                parking.delivered.inc(len(deliveries))
        except StreamEnded as ended:
            self.end(ended.reason)
            return
        except FellBehind:
            self.end("overflow")
            return
        except OSError:
            self.end("gone")
            return
        except REDIS_UNAVAILABLE as error:  # e.g. catching up during a failover
            parking.failures.failed("sse stream ended", error)
            self.end("redis_unavailable")
            return
        except Exception:
            log.exception("sse stream ended: its greenlet failed")
            self.end("gone")
            return
        self.serving = False
        self.park()

    def due_at(self) -> float:
        """Its next heartbeat or its token's expiry, whichever is first (monotonic)."""
        return min(self.outlet.wrote_at + self.parking.heartbeat, monotonic_expiry(self.follower.caller))

    def send(self, data: bytes) -> None:
        """Write `data` whole within the send time-out (from the stream's greenlet), else FellBehind."""
        send_within(self.sock, data, time.monotonic() + self.parking.send_timeout)
        self.outlet.wrote_at = time.monotonic()

    def tick(self, now: float) -> None:
        """From the timer, when the stream is due: a heartbeat, or the end of an expired access token."""
        if self.serving or self.done:
            return  # its greenlet parks it again, and that schedules it
        if time.time() >= self.follower.caller.expires_at:
            self.wake()  # follower.take_now() ends it: token_expired
            return
        outlet = self.outlet
        if now - outlet.wrote_at >= self.parking.heartbeat:
            outlet.send(self.framed(b": ping\n\n"))  # keeps proxies from closing an idle stream
            if outlet.stalled:
                self.wake()
                return
        self.parking.schedule(self)

    def end(self, reason: str) -> None:
        """Say why if the client must know, end the response, close; then what the request left to do."""
        self.done = True
        self.follower.subscription.outlet = None
        try:
            if reason not in SILENT_REASONS:
                self.outlet.finish()  # a frame's unsent rest comes first (StreamEnded when it cannot)
                farewell = self.parking.farewell(reason) if reason in FAREWELL_REASONS else b""
                self.send((chunk(farewell) if farewell else b"") + b"0\r\n\r\n" if self.chunked else farewell)
        except (StreamEnded, FellBehind, OSError):
            pass  # the client is gone or stuck: closing is all that is left
        finally:
            self.close()

    def close(self) -> None:
        """Close the connection, give its place back, and run what the request left to do at its end."""
        self.stop_watching()  # no watcher may be left on a closed descriptor
        self.sock.close()
        self.handover.release()
        for callback in self.on_end:
            try:
                callback()
            except Exception:
                log.exception("sse stream: a callback at its end failed")


class Parking:
    """This worker's parked connections, and the one timer that visits each when it is due (to the tick).

    An SSE stream is due at its next heartbeat or when its access token expires, a WebSocket at its next
    ping or its token's expiry. The SSE streams' writing (`body`, `farewell`, the heartbeat) is kept here.
    """

    def __init__(
        self,
        heartbeat: float,
        send_timeout: float,
        body: Callable[[list[Delivery]], bytes],
        farewell: Callable[[str], bytes],
        delivered,
        failures: Failures,
    ):
        """`body` makes the messages of deliveries, `farewell` the message that says why a stream ends, `failures`
        tells the log of streams that Redis ended (SSE or WebSocket, one record for the worker: an outage
        ending thousands of streams makes a line a minute)."""
        self.heartbeat = heartbeat
        self.send_timeout = send_timeout
        self.body = body
        self.farewell = farewell
        self.delivered = delivered
        self.failures = failures
        self.tick = min(1.0, heartbeat / 4)
        self.due: dict[int, list[ParkedStream]] = defaultdict(list)
        self.swept = math.floor(time.monotonic() / self.tick)
        self.timer = None

    def add(self, stream) -> None:
        """Park a connection just handed over (the timer starts with the first)."""
        if self.timer is None:
            self.timer = gevent.get_hub().loop.timer(self.tick, self.tick)
            self.timer.start(self.sweep)
        stream.park()

    def schedule(self, stream) -> None:
        """Visit `stream` (a parked SSE stream or WebSocket) when it is due: `stream.due_at()`, monotonic."""
        stream.visit = max(self.swept + 1, math.ceil(stream.due_at() / self.tick))
        self.due[stream.visit].append(stream)

    def sweep(self) -> None:
        """The timer: visit the streams due by now."""
        now = time.monotonic()
        until = math.floor(now / self.tick)
        while self.swept < until:
            self.swept += 1
            for stream in self.due.pop(self.swept, ()):
                if stream.visit != self.swept:
                    continue  # parked again since, and due later
                try:
                    stream.tick(now)
                except Exception:
                    log.exception("sse stream: its heartbeat failed")
