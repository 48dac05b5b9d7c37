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
from .follow import StreamEnded
from .schemas import StreamPosition
from .views import bp, follower_for_request

log = logging.getLogger(__name__)

RETRY_MILLISECONDS = 2000
DELIVERED = EVENTS_DELIVERED.labels("sse")


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
    heartbeat = current_app.config["SETTINGS"].sse_heartbeat_seconds

    def generate():
        OPEN_CONNECTIONS.labels("sse").inc()
        try:
            yield f"retry: {RETRY_MILLISECONDS}\n: stream open\n\n"
            deliveries, last_write = follower.take_ready(), time.monotonic()
            while True:
                if deliveries:
                    yield "".join(sse_frame(d.event.as_json(), d.event.event, d.cursor) for d in deliveries)
                    DELIVERED.inc(len(deliveries))
                    last_write = time.monotonic()
                elif time.monotonic() - last_write >= heartbeat:
                    yield ": ping\n\n"  # heartbeat: keeps proxies from closing an idle stream
                    last_write = time.monotonic()
                try:
                    deliveries = follower.wait(max(0.0, heartbeat - (time.monotonic() - last_write)))
                except StreamEnded as ended:
                    if ended.reason in ("session_ended", "token_expired"):
                        yield sse_frame(json.dumps({"reason": ended.reason}), "session_ended")
                    return  # shutdown or overflow: the client reconnects with Last-Event-ID
                except REDIS_UNAVAILABLE as error:  # e.g. catching up during a failover
                    log.warning("sse stream ended: redis unavailable (%s)", type(error).__name__)
                    return  # the client reconnects with Last-Event-ID
        finally:
            OPEN_CONNECTIONS.labels("sse").dec()
            follower.close()

    response = Response(generate(), status=200, mimetype="text/event-stream")
    # The server closes every response, also one it never started iterating (the client left first).
    response.call_on_close(follower.close)
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Connection"] = "keep-alive"  # gunicorn writes its own; kept for other servers
    response.headers["X-Accel-Buffering"] = "no"  # nginx: do not buffer this response
    return response
