"""Publishing, polling and long polling (docs/api.md, Events)."""

from __future__ import annotations

import functools
import time

from flask import Blueprint, Response, current_app, g, jsonify, request

from ..auth.guards import accepts_client_tokens, current_api_key, current_caller, login_required, user_or_api_key
from ..channels.access import check_publish, check_subscribe
from ..channels.proxy import subscribe_proxy
from ..errors import bad_request, error_response, validation_failed
from ..http import validated, validated_query
from ..metrics import EVENTS_DELIVERED, OPEN_CONNECTIONS
from ..openapi import operation
from .bus import Bus, channels_for
from .follow import Delivery, Follower, StreamEnded
from .hub import Hub, Unsubscribed
from .leases import ConnectionLeases
from .schemas import Batch, Events, Position, Publication, Published, PublishedBatch, Wait

# Every events endpoint (publishing, polling, long polling, SSE, WebSocket) also takes a client's access token with
# scope `events` for its user: an application the user signed in to through this service reads their events.
bp = accepts_client_tokens(Blueprint("events", __name__))


def get_bus() -> Bus:
    """This app's event bus."""
    return current_app.extensions["event_bus"]


def get_hub() -> Hub:
    """This worker's event hub."""
    return current_app.extensions["event_hub"]


def get_leases() -> ConnectionLeases:
    """This worker's connection leases."""
    return current_app.extensions["connection_leases"]


def follower_for_request(
    live: bool, cursor: str | None = None, lease: str | None = None, named: dict | None = None, present: bool = False
) -> Follower:
    """A follower for the caller; a `live` one holds a connection lease (429 past the user's cap), and
    raises StreamEnded if the session ended while it was subscribing (a 401 below). `named`: the named
    channels asked for (`requested_channels`); `present`: the connection counts in presence (SSE, WebSocket)."""
    settings = current_app.config["SETTINGS"]
    leases = get_leases() if live else None
    presence = current_app.extensions["presence"] if present else None
    follower = Follower(
        get_bus(), get_hub(), current_caller(), cursor, settings.ws_send_queue, leases, lease, named, presence
    )
    follower.max_named = settings.max_channels_per_connection  # for subscribe frames, served without a context
    follower.subscribe_proxy = subscribe_proxy()  # likewise: asks a proxy namespace's backend (channels/proxy.py)
    return follower


def requested_channels(raw: str | None, namespaces_read: dict | None = None) -> dict:
    """The named channels of a `?channels=` list, each with the caller's Access: 400 for a malformed name,
    422 past MAX_CHANNELS_PER_CONNECTION, 404 for a namespace that does not exist, 403 for a channel the
    caller may not read (a proxy namespace's backend asked, in this request's greenlet: 403 or 503); all
    before anything is held. The caller's own channels are read anyway. `namespaces_read`: the namespaces'
    stored texts this request has read already (the stream opener reads them with the session check)."""
    if not raw:
        return {}
    caller = current_caller()
    own = set(channels_for(caller.user_id, caller.is_admin))
    names = raw.split(",")
    if any(not name for name in names):
        raise bad_request("Query parameter 'channels' must be channel names separated by commas.")
    named = [name for name in dict.fromkeys(names) if name not in own]
    check_channel_count(len(named), current_app.config["SETTINGS"].max_channels_per_connection)
    if not named:
        return {}
    return check_subscribe(get_bus().client, caller.user_id, caller.is_admin, named, subscribe_proxy(), namespaces_read)


def check_channel_count(count: int, limit: int) -> None:
    """422 when a connection would read more named channels than MAX_CHANNELS_PER_CONNECTION."""
    if count > limit:
        raise validation_failed(f"A connection reads at most {limit} named channels (MAX_CHANNELS_PER_CONNECTION).")


REFUSED = "auth_rt.stream_refused"  # environ: (caller or None, the error) the stream opener met (opener.py)


def answers_what_the_opener_refused(view):
    """Decorate the stream view: a request the stream opener refused is answered here, with the opener's error
    raised again, so every refusal has the view's one answer (its error handlers, hooks and access line)."""

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        refused = request.environ.get(REFUSED)
        if refused is None:
            return view(*args, **kwargs)
        caller, error = refused
        if caller is not None:
            g.caller = caller
        raise error

    return wrapper


@bp.errorhandler(StreamEnded)
def session_ended(ended: StreamEnded):
    """A stream or long poll whose session ended (also while it was starting) or whose access token
    expired before it could answer: 401."""
    return error_response(401, "unauthorized", "The session has ended.")


def events_answer(deliveries: list[Delivery], cursor: str, transport: str) -> Response:
    """200 with the events and the cursor after the last one, or 204; `Event-Cursor` on both."""
    deliveries = [d for d in deliveries if d.event.__class__ is not Unsubscribed]
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


def publisher() -> tuple[str | None, bool, object]:
    """Who publishes: (user id or None for an API key, is admin, the API key or None)."""
    key = current_api_key()
    if key is not None:
        return None, False, key
    caller = current_caller()
    return caller.user_id, caller.is_admin, None


def _check_may_publish(channel: str) -> None:
    """403 unless the caller may publish there (404 for a namespace that does not exist)."""
    user_id, is_admin, key = publisher()
    check_publish(get_bus().client, channel, user_id=user_id, is_admin=is_admin, api_key=key)


PUBLISHERS = ("bearer", "cookie", "api_key")
READERS = ("bearer", "cookie")
CURSOR_HEADER = {"Event-Cursor": "The cursor to resume from."}
CHANNEL_ERRORS = (404, 422)  # ?channels=: a namespace that does not exist; too many named channels


@bp.post("/events")
@operation(
    "Publish an event",
    tags=["events"],
    body=Publication,
    responses={201: Published},
    errors=(404, 429),  # 429: RATE_LIMIT_PUBLISH
    auth=PUBLISHERS,
)
@answers_what_the_opener_refused  # and what the quick publisher met while publishing (quick_publish.py)
@user_or_api_key("events:publish")
def publish():
    """Publish an event to a channel the caller may publish to."""
    publication = validated(Publication)
    _check_may_publish(publication.channel)
    sender, is_admin, _ = publisher()  # a user other than an admin is held to RATE_LIMIT_PUBLISH
    published = get_bus().publish(publication.channel, publication.event, publication.data, sender, is_admin)
    return jsonify({"id": published.id, "channel": published.channel}), 201


@bp.post("/events/batch")
@operation(
    "Publish up to 100 events at once: all or none",
    tags=["events"],
    body=Batch,
    responses={201: PublishedBatch},
    errors=(404, 429),
    auth=PUBLISHERS,
)
@user_or_api_key("events:publish")
def publish_batch():
    """Publish up to 100 events in one atomic step: all of them, or (on any bad one) none."""
    batch = validated(Batch)
    for publication in batch.events:
        _check_may_publish(publication.channel)
    triples = [(publication.channel, publication.event, publication.data) for publication in batch.events]
    return jsonify({"ids": get_bus().publish_many(triples, *publisher()[:2])}), 201


@bp.get("/events")
@operation(
    "Polling: what is new after the cursor, at once",
    tags=["events"],
    query=Position,
    responses={200: Events, 204: None},
    headers={200: CURSOR_HEADER, 204: CURSOR_HEADER},
    errors=CHANNEL_ERRORS,
    auth=READERS,
)
@login_required
def poll():
    """Polling: whatever is new after the cursor, at once (204 when nothing is)."""
    position = validated_query(Position)
    named = requested_channels(position.channels)
    follower = follower_for_request(live=False, cursor=position.cursor or None, named=named)
    return events_answer(follower.take_ready(position.limit), follower.cursor, "poll")


@bp.get("/events/wait")
@operation(
    "Long polling: answers when something is new, or 204 after the time-out",
    tags=["events"],
    query=Wait,
    responses={200: Events, 204: None},
    headers={200: CURSOR_HEADER, 204: CURSOR_HEADER},
    errors=(*CHANNEL_ERRORS, 429),
    auth=READERS,
)
@login_required
def wait():
    """Long polling: answer as soon as something is new, or 204 after the time-out."""
    settings = current_app.config["SETTINGS"]
    asked = validated_query(Wait)
    timeout = settings.long_poll_timeout if asked.timeout is None else asked.timeout
    if timeout > settings.long_poll_max_timeout:
        raise bad_request(f"Query parameter 'timeout' must be at most {settings.long_poll_max_timeout}.")
    named = requested_channels(asked.channels)
    follower = follower_for_request(live=True, cursor=asked.cursor or None, named=named)
    OPEN_CONNECTIONS.labels("long_poll").inc()  # counted once it holds its lease, as SSE and WebSocket are
    try:
        return _hold(follower, timeout, asked.limit)
    finally:
        OPEN_CONNECTIONS.labels("long_poll").dec()


def _hold(follower: Follower, timeout: float, limit: int) -> Response:
    """Answer as soon as an event arrives, or with 204 when `timeout` seconds pass without one (or when a
    channel is taken from it: answered as on time-out, with any events that came before)."""
    with follower:
        deliveries = follower.take_ready(limit)
        deadline = time.monotonic() + timeout
        while not deliveries and (remaining := deadline - time.monotonic()) > 0:
            try:
                deliveries = follower.wait(remaining)[:limit]
            except StreamEnded as ended:
                if ended.reason in ("session_ended", "token_expired"):
                    raise  # 401, as session_ended() answers
                break  # shutdown or overflow: answer now, the client polls again with its cursor
        return events_answer(deliveries, follower.cursor, "long_poll")
