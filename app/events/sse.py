"""Server-sent events: `GET /events/stream` (wire format: docs/api.md, Server-sent events)."""

from __future__ import annotations

import json
import logging
import time

from flask import Response, current_app, request

from ..auth.guards import login_required
from ..errors import REDIS_UNAVAILABLE
from ..http import validated_query
from ..metrics import EVENTS_DELIVERED, OPEN_CONNECTIONS
from ..openapi import operation
from .bus import Event
from .follow import Follower, StreamEnded
from .outlet import Outlet, Tally, plain_socket, send_within
from .schemas import StreamPosition
from .views import bp, follower_for_request

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


class StreamBody:
    """The response body, handed to the WSGI server as it is (direct passthrough): iterating it iterates
    the generator itself, without werkzeug's wrappers around it, so a parked stream's greenlet keeps a
    shallower stack; closing it closes the response (its call_on_close callbacks), as the wrappers did."""

    __slots__ = ("generator", "response")

    def __init__(self, generator):
        self.generator = generator
        self.response: Response | None = None

    def __iter__(self):
        return self.generator

    def close(self) -> None:
        """Close the generator, then the response (which closes this again: it stops here)."""
        self.generator.close()
        response, self.response = self.response, None
        if response is not None:
            response.close()


@bp.get("/events/stream")
@operation(
    "Server-sent events: every event after the cursor (or Last-Event-ID), then live",
    tags=["events"],
    query=StreamPosition,
    responses={200: ("text/event-stream", "Events as `event:`, `id:` (the cursor) and `data:` (E) lines")},
    errors=(429,),
    auth=("bearer", "cookie"),
)
@login_required
def stream():
    """Server-sent events: every event after the cursor, then live, with heartbeats."""
    # Last-Event-ID first: a browser reconnecting by itself sends it, newer than the URL's ?cursor=.
    cursor = request.headers.get("Last-Event-ID") or validated_query(StreamPosition).cursor or None
    # 400 for a bad cursor and 429 past the user's connection cap, both before streaming.
    follower = follower_for_request(live=True, cursor=cursor)
    settings = current_app.config["SETTINGS"]
    heartbeat = settings.sse_heartbeat_seconds
    # Under gunicorn, the hub may write events to the response's socket itself (outlet.py), framed as
    # gunicorn frames the body: chunked, unless the client speaks HTTP/1.0. A HEAD has no body at all.
    sock = plain_socket(request.environ.get("gunicorn.socket")) if request.method == "GET" else None
    chunked = request.environ.get("SERVER_PROTOCOL") != "HTTP/1.0"

    def generate():
        OPEN_CONNECTIONS.labels("sse").inc()
        try:
            yield f"retry: {RETRY_MILLISECONDS}\n: stream open\n\n".encode()
            outlet = sse_outlet(follower, sock, chunked, settings.ws_send_timeout) if sock is not None else None
            deliveries, last_write = follower.take_ready(), time.monotonic()
            while True:
                if deliveries:
                    yield b"".join(message_bytes(d.event, d.cursor) for d in deliveries)
                    DELIVERED.inc(len(deliveries))
                    last_write = time.monotonic()
                elif time.monotonic() - max(last_write, outlet.wrote_at if outlet else 0) >= heartbeat:
                    yield b": ping\n\n"  # heartbeat: keeps proxies from closing an idle stream
                    last_write = time.monotonic()
                quiet = time.monotonic() - max(last_write, outlet.wrote_at if outlet else 0)
                try:
                    deliveries = follower.wait(max(0.0, heartbeat - quiet), outlet)
                except StreamEnded as ended:
                    if ended.reason in ("session_ended", "token_expired"):
                        yield sse_frame(json.dumps({"reason": ended.reason}), "session_ended").encode()
                    return  # shutdown, overflow or gone: the client reconnects with Last-Event-ID
                except REDIS_UNAVAILABLE as error:  # e.g. catching up during a failover
                    log.warning("sse stream ended: redis unavailable (%s)", type(error).__name__)
                    return  # the client reconnects with Last-Event-ID
        finally:
            OPEN_CONNECTIONS.labels("sse").dec()
            follower.close()

    body = StreamBody(generate())
    response = Response(body, status=200, mimetype="text/event-stream", direct_passthrough=True)
    body.response = response
    # The server closes every response, also one it never started iterating (the client left first).
    response.call_on_close(follower.close)
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Connection"] = "keep-alive"  # gunicorn writes its own; kept for other servers
    response.headers["X-Accel-Buffering"] = "no"  # nginx: do not buffer this response
    return response
