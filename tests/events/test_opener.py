"""The stream opener (app/events/opener.py) opens plain SSE streams without Flask, and answers them as the view
does: the same status, headers and opening. What it cannot open, and every refusal it meets, is the view's to
answer. In-process, with the real Redis and a hub that subscribes without Redis (a process without gevent)."""

from __future__ import annotations

import json
import logging

import pytest
from werkzeug.test import Client

from app.auth import sessions
from app.auth.users import set_role
from app.channels.namespaces import Namespace, put_namespace
from app.events.bus import WEBHOOKS
from app.events.hub import Subscription
from app.events.opener import StreamOpener
from app.events.schemas import MAX_CURSOR_LENGTH
from app.redis import Keys
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer

FRIEND = "https://friend.example"

pytestmark = pytest.mark.not_on_cluster("the opener's path does not depend on the Redis mode")


class QuietHub:
    """Subscribes without Redis; every subscription it made is also let go in the end."""

    def __init__(self):
        self.subscribed: list[Subscription] = []
        self.unsubscribed: list[Subscription] = []

    def subscribe(self, channels, user_id, session_id, maxsize, is_admin=False) -> Subscription:
        self.subscribed.append(Subscription(channels, user_id, session_id, maxsize, is_admin))
        return self.subscribed[-1]

    def unsubscribe(self, subscription: Subscription) -> None:
        self.unsubscribed.append(subscription)

    def watch_expiry(self, subscription: Subscription, channel: str, expires_at: float | None) -> None:
        """Grants here do not run out while a test reads them."""


class FlaskCalls:
    """Counts the requests the opener hands to Flask."""

    def __init__(self, app):
        opener = app.wsgi_app
        while not isinstance(opener, StreamOpener):
            opener = getattr(opener, "wsgi_app", None) or opener.app  # ProxyFix keeps the next one as `app`
        self.count, self.inner = 0, opener.wsgi_app
        opener.wsgi_app = self

    def __call__(self, environ, start_response):
        self.count += 1
        return self.inner(environ, start_response)


@pytest.fixture
def served(make_app):
    app = make_app(ALLOWED_ORIGINS=FRIEND, MAX_CONNECTIONS_PER_USER=2)
    app.extensions["event_hub"] = QuietHub()
    client = https_client(app)
    user = AuthActions(client).new_user_tokens()
    return app, client, user, FlaskCalls(app)


def view_of(flask: FlaskCalls) -> Client:
    """A client of Flask's side alone: the view's own answers, to compare the opener's with."""
    return Client(flask.inner)


def opened(client, path: str, headers: dict):
    response = client.get(path, headers=headers, buffered=False, base_url="https://localhost")
    first = next(iter(response.response)) if response.status_code == 200 else None
    return response, first


def test_a_plain_stream_is_opened_without_flask_and_answered_as_the_view_answers(served, rdb):
    app, client, user, flask = served
    headers = {**bearer(user["access_token"]), "Origin": FRIEND, "X-Request-ID": "same-id"}

    by_opener, opening = opened(client, "/events/stream", headers)
    assert by_opener.status_code == 200 and flask.count == 0
    by_view, view_opening = opened(view_of(flask), "/events/stream", headers)
    assert by_view.status_code == 200 and flask.count == 0

    assert dict(by_opener.headers) == dict(by_view.headers)
    assert by_opener.headers["Access-Control-Allow-Origin"] == FRIEND  # the comparison covers CORS too
    assert opening == view_opening and opening.startswith(b"retry: ")
    assert rdb.zcard(Keys.connection_leases(user["user"]["id"])) == 2
    by_opener.close()
    by_view.close()
    assert rdb.zcard(Keys.connection_leases(user["user"]["id"])) == 0
    hub = app.extensions["event_hub"]
    assert len(hub.subscribed) == 2 and hub.unsubscribed == hub.subscribed


def test_a_stream_with_the_access_cookie_is_opened_without_flask(served):
    app, client, user, flask = served
    login = {"email": user["email"], "password": DEFAULT_PASSWORD, "transport": "cookie"}
    assert client.post("/auth/login", json=login).status_code == 200
    flask.count = 0
    response, opening = opened(client, "/events/stream", {})
    assert response.status_code == 200 and opening.startswith(b"retry: ")
    assert flask.count == 0
    response.close()


@pytest.mark.parametrize(
    "path, headers, status, code",
    [
        ("/events/stream", {"Authorization": "Bearer not-a-token"}, 401, "unauthorized"),
        ("/events/stream?cursor=%%%", None, 400, "bad_request"),
        ("/events/stream?cursor=a&cursor=b", None, 400, "bad_request"),
        ("/events/stream", {"Last-Event-ID": "not-a-cursor"}, 400, "bad_request"),
    ],
)
def test_what_the_opener_refuses_is_answered_by_the_view(served, path, headers, status, code):
    app, client, user, flask = served
    headers = {**bearer(user["access_token"]), "Origin": FRIEND, **(headers or {})}
    response = client.get(path, headers=headers)
    assert response.status_code == status
    assert response.get_json()["error"]["code"] == code
    assert flask.count == 1  # the view answered, once
    assert response.headers["Access-Control-Allow-Origin"] == FRIEND and response.headers["X-Request-ID"]


def test_a_bad_query_cursor_is_refused_also_beside_a_good_last_event_id(served):
    app, client, user, flask = served
    headers = bearer(user["access_token"])
    good = client.get("/events", headers=headers).headers["Event-Cursor"]
    flask.count = 0
    too_long = "a" * (MAX_CURSOR_LENGTH + 1)  # refused by the query's model, before any cursor is read
    response = client.get(f"/events/stream?cursor={too_long}", headers={**headers, "Last-Event-ID": good})
    assert response.status_code == 400 and flask.count == 1
    response, _ = opened(client, "/events/stream?cursor=", {**headers, "Last-Event-ID": good})
    assert response.status_code == 200 and flask.count == 1  # the path opens: an empty ?cursor= is none
    response.close()


def test_past_the_cap_the_opener_holds_nothing_and_the_view_answers_429(served, rdb):
    app, client, user, flask = served
    headers = bearer(user["access_token"])
    streams = [opened(client, "/events/stream", headers)[0] for _ in range(2)]
    assert [s.status_code for s in streams] == [200, 200] and flask.count == 0

    refused = client.get("/events/stream", headers=headers)
    assert refused.status_code == 429 and refused.get_json()["error"]["code"] == "too_many_connections"
    assert refused.headers["Retry-After"] == "5" and flask.count == 1
    hub = app.extensions["event_hub"]
    # Refused on the token's claims, then the verified way: both of its subscriptions let go.
    assert len(hub.subscribed) == 4 and hub.unsubscribed == hub.subscribed[2:]
    for stream in streams:
        stream.close()
    assert rdb.zcard(Keys.connection_leases(user["user"]["id"])) == 0


def test_the_opener_writes_the_views_access_line(served, caplog):
    app, client, user, flask = served
    access_log = logging.getLogger("access")  # the request log does not propagate: listen to it too
    access_log.addHandler(caplog.handler)
    try:
        response, _ = opened(client, "/events/stream", {**bearer(user["access_token"]), "X-Request-ID": "line-id"})
        assert flask.count == 0
        response.close()
    finally:
        access_log.removeHandler(caplog.handler)
    lines = [json.loads(record.getMessage()) for record in caplog.records if record.name == "access"]
    (line,) = [line for line in lines if line["request_id"] == "line-id"]
    assert {k: line[k] for k in ("method", "path", "status", "user_id", "scheme", "host")} == {
        "method": "GET",
        "path": "/events/stream",
        "status": 200,
        "user_id": user["user"]["id"],
        "scheme": "https",
        "host": "localhost",
    }


def test_a_stream_whose_first_reads_fail_gives_back_the_lease_they_took(served, rdb):
    app, client, user, flask = served
    user_id = user["user"]["id"]
    rdb.set(Keys.stream(f"user:{user_id}"), "not a stream")  # the reads fail after the lease was taken
    response = client.get("/events/stream", headers=bearer(user["access_token"]))
    assert response.status_code == 500 and response.get_json()["error"]["code"] == "internal_error"
    assert rdb.zcard(Keys.connection_leases(user_id)) == 0
    hub = app.extensions["event_hub"]
    assert len(hub.subscribed) == 2 and hub.unsubscribed == hub.subscribed  # on the claims, then verified


@pytest.fixture
def session_lookups(monkeypatch) -> list:
    """The session checks made in a round trip of their own (the guard's), each as (user id, session id)."""
    lookups, verify, verify_reading = [], sessions.verify_session, sessions.verify_session_reading

    def counted(user_id, session_id, *args, **kwargs):
        lookups.append((user_id, session_id))
        return verify(user_id, session_id, *args, **kwargs)

    def counted_reading(user_id, session_id, token_version, reads):
        if reads:  # without them it is verify_session's, counted there
            lookups.append((user_id, session_id))
        return verify_reading(user_id, session_id, token_version, reads)

    monkeypatch.setattr(sessions, "verify_session", counted)
    monkeypatch.setattr(sessions, "verify_session_reading", counted_reading)
    return lookups


def test_a_plain_stream_checks_its_session_in_the_opening_only(served, session_lookups, rdb):
    app, client, user, flask = served
    headers = bearer(user["access_token"])
    client.get("/events", headers=headers)
    assert len(session_lookups) == 1  # the path checks a session in a round trip of its own elsewhere
    response, opening = opened(client, "/events/stream", headers)
    assert response.status_code == 200 and opening.startswith(b"retry: ") and flask.count == 1
    assert len(session_lookups) == 1  # none more: the opening checked it
    response.close()

    assert client.post("/auth/logout", headers=headers).status_code in (200, 204)
    ended = client.get("/events/stream", headers=headers)  # the opening finds the session gone
    assert ended.status_code == 401
    assert ended.get_json()["error"]["message"] == "The session has ended; log in again."  # as any request
    hub = app.extensions["event_hub"]
    assert hub.unsubscribed == hub.subscribed and rdb.zcard(Keys.connection_leases(user["user"]["id"])) == 0


def promoted(app, user_id: str) -> None:
    with app.app_context():
        assert set_role(user_id, "admin")


def test_a_token_whose_role_was_raised_since_opens_with_the_stored_role(served):
    app, client, user, flask = served
    promoted(app, user["user"]["id"])  # after the token was issued with the role "user"
    response, _ = opened(client, "/events/stream", bearer(user["access_token"]))
    assert response.status_code == 200 and flask.count == 0
    hub = app.extensions["event_hub"]
    on_claims, stored = hub.subscribed
    assert hub.unsubscribed == [on_claims] and WEBHOOKS not in on_claims.channels
    assert stored.is_admin and WEBHOOKS in stored.channels
    response.close()


def test_a_token_whose_admin_role_was_taken_since_opens_without_the_admin_channel(served):
    app, client, user, flask = served
    other = AuthActions(client).new_user_tokens()
    promoted(app, user["user"]["id"])
    promoted(app, other["user"]["id"])  # so that the first one is not the last administrator
    admin_token = AuthActions(client).login_body(user["email"])["access_token"]  # its role claim: admin
    with app.app_context():
        assert set_role(user["user"]["id"], "user")
    app.extensions["event_hub"] = hub = QuietHub()
    flask.count = 0
    response, _ = opened(client, "/events/stream", bearer(admin_token))
    assert response.status_code == 200 and flask.count == 0
    on_claims, stored = hub.subscribed
    assert on_claims.is_admin and hub.unsubscribed == [on_claims]  # the token's role: let go before any read
    assert not stored.is_admin and WEBHOOKS not in stored.channels
    response.close()


def test_a_stream_of_named_channels_is_opened_without_flask_and_answered_as_the_view_answers(served, rdb):
    app, client, user, flask = served
    with app.app_context():
        put_namespace(rdb, Namespace("rooms", "authenticated"))
    headers = {**bearer(user["access_token"]), "Origin": FRIEND}
    by_opener, opening = opened(client, "/events/stream?channels=rooms:a,rooms:b", headers)
    assert by_opener.status_code == 200 and flask.count == 0
    by_view, view_opening = opened(view_of(flask), "/events/stream?channels=rooms:a,rooms:b", headers)
    assert {k: v for k, v in by_opener.headers.items() if k != "X-Request-ID"} == {
        k: v for k, v in by_view.headers.items() if k != "X-Request-ID"
    }
    assert opening == view_opening
    hub = app.extensions["event_hub"]
    assert [{"rooms:a", "rooms:b"} <= set(s.channels) for s in hub.subscribed] == [True, True]
    by_opener.close()
    by_view.close()
    assert hub.unsubscribed == hub.subscribed


@pytest.mark.parametrize(
    "channels, status, code",
    [
        ("nowhere:a", 404, "not_found"),
        ("club:a", 403, "forbidden"),
        ("rooms:a,,rooms:b", 400, "bad_request"),
        ("rooms:Bad Name", 400, "bad_request"),
        (",".join(f"rooms:c{n}" for n in range(101)), 422, "validation_failed"),
    ],
)
def test_a_refused_channel_is_answered_by_the_view_and_holds_nothing(served, rdb, channels, status, code):
    app, client, user, flask = served
    with app.app_context():
        put_namespace(rdb, Namespace("rooms", "authenticated"))
        put_namespace(rdb, Namespace("club", "members"))
    response = client.get(
        f"/events/stream?channels={channels}", headers={**bearer(user["access_token"]), "Origin": FRIEND}
    )
    assert response.status_code == status and response.get_json()["error"]["code"] == code
    assert flask.count == 1 and response.headers["Access-Control-Allow-Origin"] == FRIEND
    view = view_of(flask).get(f"/events/stream?channels={channels}", headers=bearer(user["access_token"]))
    assert view.status_code == status and view.get_json() == response.get_json()
    assert rdb.zcard(Keys.connection_leases(user["user"]["id"])) == 0
    assert app.extensions["event_hub"].subscribed == []


def test_an_ended_session_asking_for_channels_is_told_its_session_ended_first(served, rdb):
    """Not whether a namespace exists or the user may read it: the session is checked first, as by the view."""
    app, client, user, flask = served
    headers = bearer(user["access_token"])
    assert client.post("/auth/logout", headers=headers).status_code in (200, 204)
    flask.count = 0
    for channels in ("nowhere:a", "club:a"):
        response = client.get(f"/events/stream?channels={channels}", headers=headers)
        assert response.status_code == 401 and flask.count == 1
        flask.count = 0
