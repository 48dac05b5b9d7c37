"""WebSocket: `GET /ws` with flask-sock under gunicorn's gevent worker (docs/api.md, WebSocket).

The handshake is authenticated and, for cookie callers, Origin-checked in a before_request hook:
flask-sock upgrades as soon as the view is entered, and does no Origin check of its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

import gevent
import gevent.lock
import gevent.socket
from flask import current_app, g, request
from flask_sock import Sock
from simple_websocket import ConnectionClosed
from wsproto.events import CloseConnection, Ping, TextMessage
from wsproto.frame_protocol import FrameProtocol
from wsproto.utilities import LocalProtocolError

from ..auth.guards import authenticate, origin_allowed
from ..channels.access import check_publish, check_subscribe
from ..errors import REDIS_UNAVAILABLE, ApiError, bad_request, validation_failed
from ..http import StrictJSONError, parse_json
from ..metrics import EVENTS_DELIVERED, OPEN_CONNECTIONS
from ..openapi import operation
from ..redis import Failures
from .bus import Event, user_channel
from .cursor import decode_positions
from .follow import Delivery, Follower, StreamEnded
from .handover import Handover
from .hub import Unsubscribed
from .outlet import FellBehind, Outlet, Tally, plain_socket, send_within
from .parked import Parking, monotonic_expiry
from .schemas import StreamPosition
from .views import CHANNEL_ERRORS, bp, check_channel_count, follower_for_request, get_leases, requested_channels

sock = Sock()
log = logging.getLogger(__name__)

CLOSE_NORMAL, CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_TOO_BIG = 1000, 1001, 1008, 1009
CLOSE_INTERNAL_ERROR, CLOSE_TRY_AGAIN = 1011, 1013
MESSAGE_LIMIT = 64 * 1024
DELIVERED = EVENTS_DELIVERED.labels("websocket")
DELIVERED_BY_HUB = Tally(DELIVERED)
PING_INTERVAL = 25
RECEIVE_BYTES = 4096
READS_PER_TURN = 16  # a client that keeps sending is read in turns of 64 KB, between which others run
CLOSE_REASONS = {
    "token_expired": (CLOSE_POLICY, "token expired"),
    "session_ended": (CLOSE_POLICY, "session ended"),
    "shutdown": (CLOSE_GOING_AWAY, "server shutting down"),
    "overflow": (CLOSE_TRY_AGAIN, "client fell behind; reconnect with your cursor"),
    "gone": (CLOSE_NORMAL, ""),
    "silent": (CLOSE_POLICY, "Ping/Pong timeout"),
}


def log_failure(what: str, error: Exception, failures: Failures) -> None:
    """A Redis outage is an operational event (told by `failures`, the worker's one record of streams Redis
    ended: a line a minute); anything else is a bug (with its traceback)."""
    if isinstance(error, REDIS_UNAVAILABLE):
        failures.failed(what, error)
    else:
        log.exception(what)


class FrameWriter:
    """Sits in front of the WebSocket's socket: every frame written whole and in turn.

    simple-websocket writes from two greenlets (its reader answers pings; we send events) with plain
    `send`, which may write part of a frame. Here writes are serialised, and an event frame that cannot
    be written within the send time-out leaves the client marked as behind, its unsent tail kept so a
    close frame can still follow it.
    """

    __slots__ = ("raw", "send_timeout", "lock", "unsent", "outlet")

    def __init__(self, raw_socket, send_timeout: float):
        self.raw = raw_socket
        self.send_timeout = send_timeout
        self.lock = gevent.lock.Semaphore()  # never taken twice by one greenlet
        self.unsent = b""
        self.outlet: Outlet | None = None  # the hub's writer of events: its half-written frame goes first

    def __getattr__(self, name):  # recv, fileno, close, ... go straight to the socket
        return getattr(self.raw, name)

    def send(self, data: bytes) -> int:
        """simple-websocket's own frames (pong, ping, close), after the rest of a frame the hub began."""
        with self.lock:
            rest = b""
            if self.outlet is not None:
                rest, self.outlet.unsent = self.outlet.unsent, b""
            self.raw.sendall(rest + data)
        return len(data)

    def send_with_deadline(self, data: bytes) -> None:
        """Write one frame whole, waiting for the socket no longer than the send time-out."""
        with self.lock:
            try:
                send_within(self.raw, data, time.monotonic() + self.send_timeout)
            except FellBehind as behind:
                self.unsent = behind.args[0]
                raise

    def finish_and_close(self, close_frame: bytes, grace: float) -> None:
        """Complete any half-written frame, send the close frame, within `grace` seconds; then hang up."""
        with self.lock:
            try:
                with gevent.Timeout(grace):
                    self.raw.sendall(self.unsent + close_frame)
            except (gevent.Timeout, OSError):
                pass
            with contextlib.suppress(OSError):
                self.raw.shutdown(socket.SHUT_RDWR)


@bp.before_request
def guard_websocket_handshake():
    """Everything that can refuse a handshake, while a plain HTTP answer is still possible.

    401 unauthenticated, 403 foreign origin, 400 malformed cursor, 429 too many connections: once
    flask-sock enters the view the connection is upgraded, and an HTTP answer would be written into it.
    """
    if request.endpoint != "events.websocket":
        return
    caller = authenticate()
    origin = request.headers.get("Origin")
    if caller.via == "cookie" and origin is not None and not origin_allowed(origin):
        raise ApiError(403, "origin_rejected", "WebSocket connections from this origin are not allowed.")
    if request.args.get("cursor"):
        decode_positions(request.args["cursor"])
    g.named_channels = requested_channels(request.args.get("channels"))
    g.connection_lease = get_leases().acquire(caller.user_id)


@sock.route("/ws", bp=bp)
@operation(
    "WebSocket: events after the cursor, then live; publish and ping frames (Upgrade: websocket)",
    tags=["events"],
    query=StreamPosition,
    responses={101: None},
    errors=(*CHANNEL_ERRORS, 429),
    auth=("bearer", "cookie"),
)
def websocket(ws):
    """The upgraded connection: nothing may escape from here, or Flask would write a 500 into it."""
    lease, named, follower, connection = g.pop("connection_lease"), g.pop("named_channels"), None, None
    g.access_line_at_end = write_now  # its response is never iterated: the line is written when this returns
    try:
        cursor = request.args.get("cursor") or None
        follower = follower_for_request(live=True, cursor=cursor, lease=lease, named=named, present=True)
        # simple-websocket accepts permessage-deflate whenever the client offers it.
        offered = "permessage-deflate" in request.headers.get("Sec-WebSocket-Extensions", "")
        settings = current_app.config["SETTINGS"]
        handover = Handover.possible(request.environ)
        parking = current_app.extensions["parked_streams"]
        connection = Connection(
            ws, follower, settings.ws_send_timeout, offered, settings.ws_frame_rate, failures=parking.failures
        )
        connection.serve(handover, parking)
    except StreamEnded as ended:  # the session ended while the connection was subscribing
        with contextlib.suppress(Exception):
            ws.close(*CLOSE_REASONS[ended.reason])
    except Exception as error:  # e.g. Redis gone between handshake and catch-up: the client resumes by cursor
        log_failure("websocket failed", error, current_app.extensions["parked_streams"].failures)
        with contextlib.suppress(Exception):
            ws.close(CLOSE_INTERNAL_ERROR, "internal error; reconnect with your cursor")
    finally:
        if connection is not None and connection.handover is not None:  # parked: it ends later
            g.access_line_at_end = connection.keep_access_line  # and closes its follower then
        elif follower is not None:
            follower.close()
        else:
            get_leases().release(lease)


def write_now(access_line: Callable[[], None]) -> None:
    """Write the request's access line now."""
    access_line()


class NotStarted:
    """simple-websocket's reader, left unstarted: `Connection` reads the socket itself."""

    name = "simple-websocket reader (not started)"

    def start(self) -> None:
        """Nothing to start."""

    def join(self, timeout=None) -> None:
        """Nothing to wait for."""


def reader_thread(target):
    """simple-websocket's reader thread (a greenlet under gevent) for one connection, started by it.

    Over a plain socket it is not started: the connection's own greenlet reads what the client sends
    when the socket is readable, so a parked WebSocket holds one greenlet, not two. Over TLS (bytes may
    wait decrypted above the socket) simple-websocket's reader runs as it comes.
    """
    if plain_socket(target.__self__.sock) is not None:
        return NotStarted()
    return threading.Thread(target=target)


class SocketControl:
    """Everything taken from simple-websocket beyond its public receive/send/close, in one place.

    Its own send may write part of a frame while its reader thread answers a ping, and has no
    deadline; so frames are built with its wsproto connection and written through a FrameWriter
    swapped in for its socket, and a close marks it closed. Over a plain
    socket its reader is not started: what the client sends is read here and handed to its event
    handling, and pings are sent from here. If an upgrade renames any of these attributes,
    tests/events/test_websocket_internals.py fails.
    """

    ATTRIBUTES = ("sock", "ws", "connected", "event", "thread", "input_buffer", "pong_received", "_handle_events")
    HANDSHAKE_ATTRIBUTES = ("_h11_connection", "_initiating_request", "_events")  # of wsproto's handshake

    __slots__ = ("ws", "writer", "reads_itself", "readable", "on_read")

    def __init__(self, ws, send_timeout: float):
        self.ws = ws
        self.writer = FrameWriter(ws.sock, send_timeout)
        ws.sock = self.writer
        self.reads_itself = isinstance(ws.thread, NotStarted)
        # wsproto keeps the handshake's HTTP parser (h11), its request and its (empty) queue of events for
        # the connection's whole life; past the upgrade nothing but the queue's emptiness is read again.
        for name in self.HANDSHAKE_ATTRIBUTES:
            setattr(ws.ws.handshake, name, None)
        # wsproto's connection queues an event of its own only when told the socket closed (receive_data
        # with None), which neither simple-websocket nor this class does: its always empty deque (over
        # 600 bytes) gives way to an empty tuple, which reads as empty the same way.
        ws.ws.connection._events = ()
        self.readable = gevent.get_hub().loop.io(self.writer.raw.fileno(), 1) if self.reads_itself else None
        self.on_read = None  # what the watcher calls instead of setting simple-websocket's event (parked)

    def watch_reads(self) -> None:
        """Wake the connection's greenlet (simple-websocket's event) once the client has sent something."""
        if self.readable is not None and not self.readable.active:
            self.readable.start(self._readable)

    def _readable(self) -> None:
        self.readable.stop()
        if self.on_read is not None:
            self.on_read()
        else:
            self.ws.event.set()

    def stop_reading(self) -> None:
        """Before the socket closes: no watcher may be left on its descriptor."""
        if self.readable is not None:
            self.readable.stop()
            self.readable.close()
            self.readable = None

    def take_in(self) -> None:
        """Read what the client has sent, without waiting, and have simple-websocket handle it: messages
        queue for receive(), pings are answered, a close is answered and ends the connection."""
        if not self.reads_itself:
            return
        for _ in range(READS_PER_TURN):
            if not self.ws.connected:
                return
            try:
                data = self.writer.raw._sock.recv(RECEIVE_BYTES)  # the non-blocking OS socket: never waits
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the client left
                self.ws.connected = False
                return
            self.ws.ws.receive_data(data)
            self.ws.connected = self.ws._handle_events()
        # More may be waiting: the watcher, started again before the greenlet waits, wakes it at once.

    def let_parser_go(self) -> None:
        """While parked: let go of wsproto's frame parser (about 800 bytes: decoders, a buffer, a
        generator) if it holds nothing half-received and no compression state; a fresh one, which
        `take_parser_back` makes, is then the same as the idle one."""
        connection = self.ws.ws.connection
        if connection._proto is not None and parser_is_idle(connection._proto):
            connection._proto = None

    def take_parser_back(self) -> None:
        """Before anything reads or frames again: the parser, fresh if it was let go."""
        connection = self.ws.ws.connection
        if connection._proto is None:
            connection._proto = FrameProtocol(connection.client, [])

    def ping(self) -> bool:
        """Ping the client; False if it has not answered the previous ping."""
        if not self.ws.pong_received:
            return False
        self.ws.pong_received = False
        self.writer.send(self.ws.ws.send(Ping()))
        return True

    @property
    def open(self) -> bool:
        """Whether simple-websocket still takes the connection as open."""
        return self.ws.connected

    def text_frame(self, message: str) -> bytes:
        """The bytes of one text frame."""
        return self.ws.ws.send(TextMessage(data=message))

    def close_frame(self, code: int, reason: str) -> bytes:
        """The bytes of a close frame with this code and reason."""
        return self.ws.ws.send(CloseConnection(code, reason))

    def mark_closed(self) -> None:
        """Mark the connection closed: receive() raises ConnectionClosed from now on."""
        self.ws.connected = False

    def share_wakeups(self, event) -> None:
        """Have simple-websocket set `event` (instead of its own) when a frame arrives or the connection ends."""
        was_set, self.ws.event = self.ws.event.is_set(), event
        if was_set:
            event.set()


def parser_is_idle(parser: FrameProtocol) -> bool:
    """Whether wsproto's frame parser is as a new one would be: no extension, no frame or message begun
    in either direction, not past a close."""
    frames, messages = parser._frame_decoder, parser._message_decoder
    return (
        not parser.extensions
        and parser._outbound_opcode is None
        and parser._parse_more.gi_frame is not None
        and frames.header is None
        and not frames.buffer.buffer
        and messages.opcode is None
    )


class Connection:
    """One upgraded WebSocket, served by one greenlet: it answers the client's frames and sends what the
    hub cannot write itself (see outlet.py), waking for either on one event.

    The event is set by a watcher on the socket when the client has sent something (the greenlet then
    reads it, and simple-websocket handles it), and by the hub when the greenlet is needed. The greenlet
    also pings the client every PING_INTERVAL seconds and ends a connection whose client did not answer
    the last ping. Over TLS, simple-websocket's own reader greenlet reads and pings instead.

    Once idle, a WebSocket on a plain socket under gunicorn is handed over (handover.py) and parked
    without a greenlet, as an SSE stream is (parked.py): the view returns, and the watcher, the hub and
    the parking's timer (pings, token expiry) spawn a greenlet for one turn when one is needed.
    """

    __slots__ = (
        "ws",
        "compressed",
        "follower",
        "caller",
        "socket",
        "send_timeout",
        "next_ping",
        "handover",
        "parking",
        "writes",
        "serving",
        "done",
        "visit",
        "access_line",
        "frames",
        "failures",
    )

    def __init__(
        self,
        ws,
        follower: Follower,
        send_timeout: float,
        compressed: bool = True,
        frame_rate: int = 20,
        *,
        failures: Failures,
    ):
        """`compressed`: whether the client may have agreed to permessage-deflate (then wsproto frames);
        `frame_rate`: how many frames the client may send a second (WS_FRAME_RATE); `failures`: where a Redis
        outage that ends it is told (the worker's one record for its streams)."""
        self.ws = ws
        self.frames = FrameWindow(frame_rate)
        self.compressed = compressed
        self.follower = follower
        self.caller = follower.caller
        self.socket = SocketControl(ws, send_timeout)
        self.send_timeout = send_timeout
        self.next_ping = 0.0
        self.handover: Handover | None = None  # set once handed over: the connection is parked
        self.parking: Parking | None = None
        self.writes: Outlet | None = None
        self.serving = self.done = False
        self.visit = 0  # the parking timer's tick at which it is due
        self.access_line: Callable[[], None] | None = None  # written at the end of a parked connection
        self.failures = failures

    def serve(self, handover: Handover | None = None, parking: Parking | None = None) -> None:
        """Deliver events and answer client frames until either side ends (then close with the matching
        code), or until it is idle and can be handed over to `parking`."""
        OPEN_CONNECTIONS.labels("websocket").inc()
        try:
            self.socket.share_wakeups(self.follower.subscription.ready)
            welcome = {"type": "welcome", "cursor": self.follower.cursor, "start": self.follower.start_cursor}
            self.send(json.dumps({**welcome, "user": self.caller.user}))
            outlet = self.outlet()
            deliveries = self.follower.take_ready()
            self.next_ping = time.monotonic() + PING_INTERVAL
            while True:
                self.turn(deliveries)
                if parking is not None and self.can_park(handover, outlet):
                    self.hand_over(handover, parking, outlet)
                    return
                self.socket.watch_reads()
                deliveries = self.follower.wait(max(0.0, self.next_ping - time.monotonic()), outlet)
        except Exception as error:
            self.end_with(error)
        finally:
            if self.handover is None:
                self.socket.stop_reading()
                OPEN_CONNECTIONS.labels("websocket").dec()

    def turn(self, deliveries: list[Delivery]) -> None:
        """Send deliveries, answer what the client sent, ping it when due (StreamEnded if it went silent)."""
        self.deliver(deliveries)
        self.answer_client()
        if self.socket.reads_itself and time.monotonic() >= self.next_ping:
            if not self.socket.ping():
                raise StreamEnded("silent")
            self.next_ping = time.monotonic() + PING_INTERVAL

    def end_with(self, error: Exception) -> None:
        """Close with the code `error` calls for."""
        if isinstance(error, StreamEnded):
            self.close(*CLOSE_REASONS[error.reason])
        elif isinstance(error, FellBehind):
            self.close(*CLOSE_REASONS["overflow"])
        elif isinstance(error, (ConnectionClosed, OSError, LocalProtocolError)):  # the client left (maybe mid-send)
            self.close(CLOSE_NORMAL, "")
        else:  # e.g. Redis failing mid-catch-up: the client reconnects and resumes by cursor
            log_failure("websocket failed", error, self.failures)
            self.close(CLOSE_INTERNAL_ERROR, "internal error; reconnect with your cursor")

    # Parked (see the class's docstring).

    def can_park(self, handover: Handover | None, outlet: Outlet | None) -> bool:
        """Idle, on a plain socket this greenlet reads itself, and with a place in gunicorn's pool."""
        return (
            handover is not None
            and outlet is not None
            and self.socket.reads_itself
            and self.follower.idle()
            and not self.socket.writer.unsent
            and handover.can_start()
        )

    def hand_over(self, handover: Handover, parking: Parking, outlet: Outlet) -> None:
        """Take the socket from gunicorn's handler; park once the handler greenlet has ended."""
        sock = handover.take()
        self.socket.writer.raw, outlet.sock, outlet.raw = sock, sock, sock._sock
        self.handover, self.parking, self.writes = handover, parking, outlet
        self.ws.connected = False  # flask-sock closes the connection when the view returns: nothing to close
        gevent.getcurrent().rawlink(self.resume)

    def resume(self, _handler=None) -> None:
        """The handler greenlet has ended: the connection is open again, and parked."""
        self.ws.connected = True
        self.ws.environ = None  # simple-websocket keeps the handshake's environ: gunicorn's request with it
        self.follower.subscription.parked = self
        self.socket.on_read = self.wake
        self.parking.add(self)

    def park(self) -> None:
        """Lend the outlet to the hub, watch the socket, wait for the timer; at once if something waits."""
        if not self.follower.idle():
            self.wake()
            return
        self.follower.subscription.outlet = self.writes
        self.socket.let_parser_go()
        self.frames.forget_old(time.monotonic())
        self.socket.watch_reads()
        self.parking.schedule(self)

    def due_at(self) -> float:
        """The next ping or the token's expiry, whichever is first (monotonic)."""
        return min(self.next_ping, monotonic_expiry(self.caller))

    def tick(self, now: float) -> None:
        """From the parking's timer: a ping is due, or the token expired; one turn does either."""
        if not self.serving and not self.done:
            self.wake()

    def wake(self) -> None:
        """Take the outlet back and spawn a greenlet for one turn."""
        if not self.serving and not self.done:
            self.serving = True
            self.follower.subscription.outlet = None
            self.socket.take_parser_back()
            gevent.spawn(self.serve_parked)

    def serve_parked(self) -> None:
        """One turn for a parked connection: what is queued, what the client sent, a ping; park again, or end."""
        try:
            while True:
                deliveries = self.follower.take_now(self.writes)
                self.turn(deliveries)
                if not deliveries and self.follower.idle():
                    break
        except Exception as error:
            self.end_with(error)
            self.finish()
            return
        self.serving = False
        self.park()

    def keep_access_line(self, access_line: Callable[[], None]) -> None:
        """The request's access line, for when the connection ends (from the request's end, once parked)."""
        self.access_line = access_line

    def finish(self) -> None:
        """After the close: stop watching, free the lease and the pool place, close the socket, log."""
        self.done = True
        self.socket.stop_reading()
        OPEN_CONNECTIONS.labels("websocket").dec()
        self.follower.close()
        self.handover.release()
        with contextlib.suppress(OSError):
            self.socket.writer.raw.close()
        if self.access_line is not None:
            self.access_line()

    def answer_client(self) -> None:
        """Every frame the client has sent so far (ConnectionClosed once it has left). A frame's answer goes out
        before the next frame is read, followed by what it queued (a subscribed channel's history): so a
        `subscribed` cursor covers exactly what was sent before it, and a client may resume from it."""
        self.socket.take_in()
        while (message := self.ws.receive(timeout=0)) is not None:
            if self.frames.admit(time.monotonic()):
                reply = handle_client_message(self.follower, message)
            else:  # not even parsed: a flood costs no more than its answer
                reply = too_many_frames(self.frames.rate)
            if reply is not None:
                self.socket.writer.send(self.socket.text_frame(json.dumps(reply)))
            if self.follower.pending:
                self.deliver(self.follower.take_ready())

    def deliver(self, deliveries: list[Delivery]) -> None:
        """Send each delivery's frame, in order."""
        for delivery in deliveries:
            self.send(event_message(delivery))
        DELIVERED.inc(len(deliveries))

    def outlet(self) -> Outlet | None:
        """The hub's way to write this connection's events while its greenlet is parked (none over TLS)."""
        writer = self.socket.writer
        if plain_socket(writer.raw) is None:
            return None
        writer.outlet = Outlet(
            self.follower,
            writer.raw,
            self.event_frame,
            DELIVERED_BY_HUB,
            writer.send_with_deadline,
            busy=writer.lock.locked,
        )
        return writer.outlet

    def event_frame(self, event: Event, cursor: str) -> bytes:
        """The frame the hub writes for `event` (ConnectionResetError once the connection is closing)."""
        if not self.socket.open:  # closing: nothing more may be sent
            raise ConnectionResetError()
        if self.compressed:  # framed by wsproto, which keeps the compression state
            try:
                return self.socket.text_frame(event_message(Delivery(event, cursor)))
            except LocalProtocolError as error:
                raise ConnectionResetError() from error
        head, tail = event.message_parts()
        return text_frame(head + cursor.encode() + tail)

    def send(self, message: str) -> None:
        """One event frame, written whole within the send time-out (else FellBehind)."""
        self.socket.writer.send_with_deadline(self.socket.text_frame(message))

    def close(self, code: int, reason: str) -> None:
        """Send the close frame (after any half-written one), then hang up."""
        if self.socket.open:
            self.socket.mark_closed()
            try:
                frame = self.socket.close_frame(code, reason)
            except LocalProtocolError:  # the client's close came first: nothing more to say, just hang up
                frame = b""
            self.socket.writer.finish_and_close(frame, grace=self.send_timeout)


class FrameWindow:
    """At most `rate` client frames in any second: the times of those let through in the last second (a
    frame refused is not counted, so a client that keeps sending gets each second's share, no more)."""

    __slots__ = ("rate", "times")

    def __init__(self, rate: int):
        self.rate = rate
        self.times: deque[float] | None = None  # made at the first frame, let go once a second has passed

    def admit(self, now: float) -> bool:
        """Whether a frame arriving `now` (monotonic seconds) may be acted on; counts it if so."""
        self.forget_old(now)
        if self.times is None:
            self.times = deque()
        elif len(self.times) >= self.rate:
            return False
        self.times.append(now)
        return True

    def forget_old(self, now: float) -> None:
        """Drop the times more than a second old (the whole record once none is left: a parked connection
        keeps nothing)."""
        times = self.times
        if times is None:
            return
        while times and now - times[0] >= 1.0:
            times.popleft()
        if not times:
            self.times = None


def too_many_frames(rate: int) -> dict:
    """The answer to a frame past the connection's frame rate."""
    return {
        "type": "error",
        "code": "rate_limited",
        "message": f"Too many frames: at most {rate} a second (WS_FRAME_RATE); this one was not acted on.",
    }


def text_frame(payload: bytes) -> bytes:
    """One final, unmasked, uncompressed text frame (a server's) carrying `payload` (UTF-8)."""
    length = len(payload)
    if length < 126:
        head = bytes((0x81, length))
    elif length < 65536:
        head = b"\x81\x7e" + length.to_bytes(2, "big")
    else:
        head = b"\x81\x7f" + length.to_bytes(8, "big")
    return head + payload


def event_message(delivery: Delivery) -> str:
    """An event frame's text: E with its type and the cursor after it (or a channel taken: `unsubscribed`)."""
    if delivery.event.__class__ is Unsubscribed:
        notice = delivery.event
        return json.dumps({"type": "unsubscribed", "channel": notice.channel, "reason": notice.reason})
    return delivery.event.as_json(delivery.cursor, type="event")


def handle_client_message(follower: Follower, message) -> dict | None:
    """One client frame: subscribe, unsubscribe, publish, or ping. Bad frames get an error frame (with the
    channel, for a channel's frame); the connection stays open."""
    channel = None
    try:
        frame = parse_json(message)
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            raise bad_request("A frame must be a JSON object with a string 'type'.")
        kind = frame["type"]
        if kind == "ping":
            return {"type": "pong"}
        if kind not in FRAME_HANDLERS:
            raise bad_request(f"Unknown frame type {kind!r}.")
        channel = frame.get("channel")
        if channel is not None and not isinstance(channel, str):
            channel = None
            raise bad_request("'channel' must be a string.")
        return FRAME_HANDLERS[kind](follower, frame, channel)
    except StrictJSONError as error:
        return {"type": "error", "code": "bad_request", "message": f"A frame must be plain JSON text: {error}."}
    except ApiError as error:
        return with_channel({"type": "error", "code": error.code, "message": error.message}, channel)
    except REDIS_UNAVAILABLE:
        reply = {"type": "error", "code": "unavailable", "message": "A dependency is unavailable; retry shortly."}
        return with_channel(reply, channel)


def with_channel(reply: dict, channel: str | None) -> dict:
    """An error frame about a channel's frame names the channel."""
    return {**reply, "channel": channel} if channel is not None else reply


def publish_frame(follower: Follower, frame: dict, channel: str | None) -> dict:
    """Publish to `channel` (default: the caller's own channel) under the channel's rules; `ack` with the id."""
    caller, bus = follower.caller, follower.bus
    event = frame.get("event")
    if not isinstance(event, str):
        raise bad_request("'event' must be a string.")
    channel = channel or user_channel(caller.user_id)
    check_publish(bus.client, channel, user_id=caller.user_id, is_admin=caller.is_admin, api_key=None)
    published = bus.publish(channel, event, frame.get("data"), caller.user_id, caller.is_admin)
    return {"type": "ack", "id": published.id}


def subscribe_frame(follower: Follower, frame: dict, channel: str | None) -> dict:
    """Read one more named channel from now on (or from `cursor`): `subscribed` with the cursor where it
    starts (the channel's history after it follows as event frames)."""
    if channel is None:
        raise bad_request("A subscribe frame needs a 'channel'.")
    cursor = frame.get("cursor")
    if cursor is not None and not isinstance(cursor, str):
        raise bad_request("'cursor' must be a string.")
    if cursor:
        decode_positions(cursor)
    caller = follower.caller
    if channel in follower.channels:
        return {"type": "subscribed", "channel": channel, "cursor": follower.cursor}
    check_channel_count(len(follower.named) + 1, follower.max_named)
    # A proxy namespace's backend is asked here, in this connection's greenlet (403 or 503 as error frames).
    proxy = follower.subscribe_proxy
    access = check_subscribe(follower.bus.client, caller.user_id, caller.is_admin, [channel], proxy)[channel]
    started = follower.add_channel(channel, access, cursor or None)
    return {"type": "subscribed", "channel": channel, "cursor": started}


def unsubscribe_frame(follower: Follower, frame: dict, channel: str | None) -> dict:
    """Read a named channel no more: `unsubscribed` (also when it was not read)."""
    if channel is None:
        raise bad_request("An unsubscribe frame needs a 'channel'.")
    if channel in follower.channels and channel not in follower.access:
        raise validation_failed("A connection always reads its own channels; only named channels can be left.")
    follower.remove_channel(channel)
    return {"type": "unsubscribed", "channel": channel}


FRAME_HANDLERS = {"publish": publish_frame, "subscribe": subscribe_frame, "unsubscribe": unsubscribe_frame}


def init_app(app) -> None:
    """Bind flask-sock with the ping interval and the message size limit."""
    app.config["SOCK_SERVER_OPTIONS"] = {
        "ping_interval": PING_INTERVAL,  # for simple-websocket's reader, where it runs (TLS)
        "max_message_size": MESSAGE_LIMIT,
        "thread_class": reader_thread,
    }
    sock.init_app(app)
