"""Publishing, polling and long polling (docs/api.md, Events)."""

from __future__ import annotations

import time

from flask import Blueprint, Response, current_app, jsonify, request

from ..auth.guards import current_api_key, current_caller, login_required, user_or_api_key
from ..errors import bad_request, forbidden, unauthorized, validation_failed
from ..http import field, json_body, number_arg
from ..metrics import EVENTS_DELIVERED, OPEN_CONNECTIONS
from .bus import Bus, may_publish
from .follow import Delivery, Follower, StreamEnded
from .hub import Hub
from .leases import ConnectionLeases

bp = Blueprint("events", __name__)

POLL_LIMIT_DEFAULT, POLL_LIMIT_MAX = 100, 1000


def get_bus() -> Bus:
    """This app's event bus."""
    return current_app.extensions["event_bus"]


def get_hub() -> Hub:
    """This worker's event hub."""
    return current_app.extensions["event_hub"]


def get_leases() -> ConnectionLeases:
    """This worker's connection leases."""
    return current_app.extensions["connection_leases"]


def cursor_arg() -> str | None:
    """The `cursor` query parameter, if given."""
    return request.args.get("cursor") or None


def follower_for_request(live: bool, cursor: str | None = None, lease: str | None = None) -> Follower:
    """A follower for the caller; a `live` one holds a connection lease (429 past the user's cap)."""
    settings = current_app.config["SETTINGS"]
    leases = get_leases() if live else None
    return Follower(get_bus(), get_hub(), current_caller(), cursor, settings.ws_send_queue, leases, lease)


def events_answer(deliveries: list[Delivery], cursor: str, transport: str) -> Response:
    """200 with the events and the cursor after the last one, or 204; `Event-Cursor` on both."""
    EVENTS_DELIVERED.labels(transport).inc(len(deliveries))
    if not deliveries:
        response = Response(status=204)
        del response.headers["Content-Type"]
    else:
        cursor = deliveries[-1].cursor
        events = ",".join(d.event.as_json() for d in deliveries)
        response = Response(f'{{"events":[{events}],"cursor":"{cursor}"}}', mimetype="application/json")
    response.headers["Event-Cursor"] = cursor
    response.headers["Cache-Control"] = "no-store"
    return response


BATCH_LIMIT = 100


def _check_may_publish(channel: str) -> None:
    """403 unless the caller may publish there: users their own channel (admins any), keys their list."""
    key = current_api_key()
    if key is not None:
        if not key.may_publish(channel):
            raise forbidden(f"This API key may not publish to {channel!r}.")
        return
    caller = current_caller()
    if not may_publish(caller.user_id, caller.is_admin, channel):
        raise forbidden("You may publish only to your own channel.")


@bp.post("/events")
@user_or_api_key("events:publish")
def publish():
    """Publish an event to a channel the caller may publish to."""
    body = json_body()
    channel, event = field(body, "channel"), field(body, "event")
    _check_may_publish(channel)
    published = get_bus().publish(channel, event, body.get("data"))
    return jsonify({"id": published.id, "channel": published.channel}), 201


@bp.post("/events/batch")
@user_or_api_key("events:publish")
def publish_batch():
    """Publish up to 100 events in one atomic step: all of them, or (on any bad one) none."""
    events = field(json_body(), "events", list)
    if not 1 <= len(events) <= BATCH_LIMIT:
        raise validation_failed(f"A batch holds 1 to {BATCH_LIMIT} events.")
    triples = []
    for number, item in enumerate(events):
        if not isinstance(item, dict):
            raise bad_request(f"Event {number} must be an object with channel, event and data.")
        channel, event = field(item, "channel"), field(item, "event")
        _check_may_publish(channel)
        triples.append((channel, event, item.get("data")))
    return jsonify({"ids": get_bus().publish_many(triples)}), 201


@bp.get("/events")
@login_required
def poll():
    """Polling: whatever is new after the cursor, at once (204 when nothing is)."""
    limit = number_arg("limit", POLL_LIMIT_DEFAULT, 1, POLL_LIMIT_MAX, int)
    follower = follower_for_request(live=False, cursor=cursor_arg())
    return events_answer(follower.take_ready(limit), follower.cursor, "poll")


@bp.get("/events/wait")
@login_required
def wait():
    """Long polling: answer as soon as something is new, or 204 after the time-out."""
    settings = current_app.config["SETTINGS"]
    timeout = number_arg("timeout", settings.long_poll_timeout, 0, settings.long_poll_max_timeout)
    limit = number_arg("limit", POLL_LIMIT_DEFAULT, 1, POLL_LIMIT_MAX, int)
    OPEN_CONNECTIONS.labels("long_poll").inc()
    try:
        return _hold(follower_for_request(live=True, cursor=cursor_arg()), timeout, limit)
    finally:
        OPEN_CONNECTIONS.labels("long_poll").dec()


def _hold(follower: Follower, timeout: float, limit: int) -> Response:
    """Answer as soon as an event arrives, or with 204 when `timeout` seconds pass without one."""
    with follower:
        deliveries = follower.take_ready(limit)
        deadline = time.monotonic() + timeout
        while not deliveries and (remaining := deadline - time.monotonic()) > 0:
            try:
                deliveries = follower.wait(remaining)[:limit]
            except StreamEnded as ended:
                if ended.reason in ("session_ended", "token_expired"):
                    raise unauthorized("The session has ended.") from None
                break  # shutdown or overflow: answer now, the client polls again with its cursor
        return events_answer(deliveries, follower.cursor, "long_poll")
