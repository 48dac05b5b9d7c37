"""Server-sent events: `GET /events/stream` (wire format: docs/api.md, Server-sent events)."""

from __future__ import annotations

import json
import logging
import time

from flask import Flask, Response, current_app, request

from ..auth.guards import login_required
from ..errors import REDIS_UNAVAILABLE
from ..http import validated_query
from ..metrics import EVENTS_DELIVERED, OPEN_CONNECTIONS
from ..openapi import operation
from ..redis import Failures
from .bus import Event
from .follow import Delivery, Follower, StreamEnded
from .handover import Handover
from .hub import Unsubscribed
from .outlet import Outlet, Tally, plain_socket, send_within
from .parked import FAREWELL_REASONS, ParkedStream, Parking
from .schemas import StreamPosition
from .views import CHANNEL_ERRORS, answers_what_the_opener_refused, bp, follower_for_request, requested_channels

log = logging.getLogger(__name__)

RETRY_MILLISECONDS = 2000
DELIVERED = EVENTS_DELIVERED.labels("sse")
DELIVERED_BY_HUB = Tally(DELIVERED)


def sse_frame(data: str, event: str | None = None, id: str | None = None) -> str:
    """One message: optional id and event lines, data line(s), then the blank line that ends it.

    A data value with line breaks becomes several `data:` lines (the client joins them with \\n),
    so a newline inside the data can never end the message early.
    """
    if "\n" not in data and "\r" not in data:  # JSON text never holds a raw line break: the common case
        head = (f"id: {id}\n" if id is not None else "") + (f"event: {event}\n" if event is not None else "")
        return f"{head}data: {data}\n\n"
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.extend(f"data: {line}" for line in data.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return "\n".join(lines) + "\n\n"


def message_bytes(event: Event, cursor: str) -> bytes:
    """One event's SSE message: the reader's cursor as its id, then the event's shared encoding."""
    return b"id: %b\n%b" % (cursor.encode(), event.sse_tail())


def messages(deliveries: list[Delivery]) -> bytes:
    """The SSE messages of deliveries, as one piece."""
    return b"".join(
        unsubscribed_message(d.event) if d.event.__class__ is Unsubscribed else message_bytes(d.event, d.cursor)
        for d in deliveries
    )


def unsubscribed_message(notice: Unsubscribed) -> bytes:
    """The event that tells the client a channel was taken from the stream (no id: it moves no cursor)."""
    return sse_frame(json.dumps({"channel": notice.channel, "reason": notice.reason}), "unsubscribed").encode()


def farewell(reason: str) -> bytes:
    """The event that tells the client why its stream ends (session_ended, token_expired)."""
    return sse_frame(json.dumps({"reason": reason}), "session_ended").encode()


def init_app(app: Flask) -> None:
    """This worker's parked streams (parked.py)."""
    settings = app.config["SETTINGS"]
    app.extensions["parked_streams"] = Parking(
        settings.sse_heartbeat_seconds,
        settings.ws_send_timeout,
        messages,
        farewell,
        DELIVERED,
        Failures(logging.getLogger("app.events"), settings.redis_url),  # SSE and WebSocket streams alike
    )


def sse_outlet(follower: Follower, sock, chunked: bool, send_timeout: float) -> Outlet:
    """An outlet writing SSE messages straight to the response's socket, in the WSGI server's framing."""

    def frame(event: Event, cursor: str) -> bytes:
        if not chunked:
            return message_bytes(event, cursor)
        cursor_bytes, tail = cursor.encode(), event.sse_tail()  # one chunk: size, "id: <cursor>\n", tail
        return b"%x\r\nid: %b\n%b\r\n" % (len(cursor_bytes) + len(tail) + 5, cursor_bytes, tail)

    def finish_rest(rest: bytes) -> None:
        send_within(sock, rest, time.monotonic() + send_timeout)

    return Outlet(follower, sock, frame, DELIVERED_BY_HUB, finish_rest)


class StreamResponse(Response):
    """A response whose closing callbacks a parked stream takes over."""

    def take_close_callbacks(self) -> list:
        """What closing the response would run, for whoever ends the stream later (a parked stream)."""
        callbacks, self._on_close = self._on_close, []
        return callbacks


class StreamBody:
    """The response body, handed to the WSGI server as it is (direct passthrough): iterating it iterates
    the generator itself, without werkzeug's wrappers around it, so a stream's greenlet keeps a shallower
    stack. Closing it closes the response (its call_on_close callbacks), as the wrappers did; or, when
    the generator handed the connection over (`park` set), parks the stream with those callbacks."""

    __slots__ = ("generator", "response", "park")

    def __init__(self, generator):
        self.generator = generator
        self.response: StreamResponse | None = None
        self.park = None

    def __iter__(self):
        return self.generator

    def close(self) -> None:
        """Close the generator, then the response (which closes this again: it stops here) or park it."""
        self.generator.close()
        response, self.response = self.response, None
        park, self.park = self.park, None
        if park is not None and response is not None:
            park(response.take_close_callbacks())
        elif response is not None:
            response.close()


@bp.get("/events/stream")
@operation(
    "Server-sent events: every event after the cursor (or Last-Event-ID), then live",
    tags=["events"],
    query=StreamPosition,
    responses={200: ("text/event-stream", "Events as `event:`, `id:` (the cursor) and `data:` (E) lines")},
    errors=(*CHANNEL_ERRORS, 429),
    auth=("bearer", "cookie"),
)
@answers_what_the_opener_refused
@login_required
def stream():
    """Server-sent events: every event after the cursor, then live, with heartbeats."""
    # Last-Event-ID first: a browser reconnecting by itself sends it, newer than the URL's ?cursor=.
    asked = validated_query(StreamPosition)
    cursor = request.headers.get("Last-Event-ID") or asked.cursor or None
    # 400 for a bad cursor or channel list, 403 for a channel not allowed, 429 past the user's
    # connection cap: all before streaming.
    named = requested_channels(asked.channels)
    follower = follower_for_request(live=True, cursor=cursor, named=named, present=True)
    body = stream_body(
        follower, request.environ, current_app.config["SETTINGS"], current_app.extensions["parked_streams"]
    )
    response = StreamResponse(body, status=200, mimetype="text/event-stream", direct_passthrough=True)
    body.response = response
    # The server closes every response, also one it never started iterating (the client left first).
    response.call_on_close(follower.close)
    response.headers.extend(STREAM_HEADERS)
    return response


# Besides its type: an event stream is never cached, and nginx passes it on as it comes instead of buffering it.
STREAM_HEADERS = [
    ("Cache-Control", "no-cache"),
    ("Connection", "keep-alive"),  # gunicorn writes its own; kept for other servers
    ("X-Accel-Buffering", "no"),
]
STREAM_CONTENT_TYPE = "text/event-stream; charset=utf-8"
OPENING_LINES = f"retry: {RETRY_MILLISECONDS}\n: stream open".encode()


def opening(follower: Follower) -> bytes:
    """The stream's opening: the reconnection delay and a comment (which no event source dispatches) saying that it
    is open and where it began reading, before its history (a named channel its cursor did not name: at the
    present). A client that resumes from `start` until the first event misses nothing on a reconnect."""
    return OPENING_LINES + b", start " + follower.start_cursor.encode() + b"\n\n"


def stream_body(follower: Follower, environ: dict, settings, parking: Parking) -> StreamBody:
    """The stream's body: the opening lines, the history, then live events and heartbeats, until the stream
    ends or, idle, is handed over and parked. The caller sets its `response` (what closing it closes)."""
    heartbeat = settings.sse_heartbeat_seconds
    # Under gunicorn, the hub may write events to the response's socket itself (outlet.py), framed as
    # gunicorn frames the body: chunked, unless the client speaks HTTP/1.0. A HEAD has no body at all.
    # An idle stream is handed over from gunicorn's handler and parked without a greenlet (parked.py).
    get = environ["REQUEST_METHOD"] == "GET"
    sock = plain_socket(environ.get("gunicorn.socket")) if get else None
    handover = Handover.possible(environ) if get else None
    chunked = environ.get("SERVER_PROTOCOL") != "HTTP/1.0"

    def finish() -> None:
        OPEN_CONNECTIONS.labels("sse").dec()
        follower.close()

    def park(callbacks: list) -> None:
        outlet = sse_outlet(follower, handover.take(), chunked, settings.ws_send_timeout)
        parking.add(ParkedStream(parking, follower, outlet, handover, chunked, [finish, *callbacks]))

    def generate():
        OPEN_CONNECTIONS.labels("sse").inc()
        try:
            # The opening lines and the history read with the opening go out in one write (with gunicorn's head).
            deliveries = follower.take_ready()
            yield opening(follower) + messages(deliveries)
            if deliveries:
                DELIVERED.inc(len(deliveries))
            # Only once the head is out may the hub write to the socket.
            outlet = sse_outlet(follower, sock, chunked, settings.ws_send_timeout) if sock is not None else None
            deliveries, last_write = follower.take_ready(), time.monotonic()
            while True:
                if deliveries:
                    yield messages(deliveries)
                    DELIVERED.inc(len(deliveries))
                    last_write = time.monotonic()
                elif time.monotonic() - max(last_write, outlet.wrote_at if outlet else 0) >= heartbeat:
                    yield b": ping\n\n"  # heartbeat: keeps proxies from closing an idle stream
                    last_write = time.monotonic()
                if handover is not None and follower.idle() and handover.can_start():
                    handover.prepare()
                    body.park = park
                    return  # body.close() parks the stream
                quiet = time.monotonic() - max(last_write, outlet.wrote_at if outlet else 0)
                try:
                    deliveries = follower.wait(max(0.0, heartbeat - quiet), outlet)
                except StreamEnded as end:
                    if end.reason in FAREWELL_REASONS:
                        yield farewell(end.reason)
                    return  # shutdown, overflow or gone: the client reconnects with Last-Event-ID
                except REDIS_UNAVAILABLE as error:  # e.g. catching up during a failover
                    parking.failures.failed("sse stream ended", error)
                    return  # the client reconnects with Last-Event-ID
        finally:
            if body.park is None:
                finish()

    body = StreamBody(generate())
    return body
