"""A logout that lands while a stream is starting, after its request was authenticated but before the
hub's subscription could hear the logout's control message, still ends it: the stream looks at its
session once more after subscribing. In-process, with the real Redis, and a hub that lets the session
end at exactly that moment (a race a real hub loses too rarely to test). The WebSocket view is called
past its upgrade, with a stand-in for the upgraded connection."""

from __future__ import annotations

import pytest

from app.auth.sessions import end_session
from app.events.hub import Subscription
from app.events.ws import guard_websocket_handshake
from app.redis import Keys
from tests.utils import bearer


class HubDuringALogout:
    """Subscribes like the event hub, but the caller's session ends (if `logout`) as the subscription
    is being made, so that the hub never hears of it."""

    def __init__(self, logout: bool):
        self.logout = logout
        self.subscribed: list[Subscription] = []
        self.unsubscribed: list[Subscription] = []

    def subscribe(
        self, channels: list[str], user_id: str, session_id: str, maxsize: int, is_admin: bool = False
    ) -> Subscription:
        if self.logout:
            assert end_session(user_id, session_id)
        subscription = Subscription(channels, user_id, session_id, maxsize, is_admin)
        self.subscribed.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self.unsubscribed.append(subscription)


def held_leases(rdb, user_id: str) -> int:
    return rdb.zcard(Keys.connection_leases(user_id))


def start(app, client, auth, path: str, logout: bool):
    tokens = auth.new_user_tokens()
    hub = app.extensions["event_hub"] = HubDuringALogout(logout)
    response = client.get(path, headers=bearer(tokens["access_token"]), buffered=False)
    return response, hub, tokens["user"]["id"]


@pytest.mark.parametrize(
    "path, message",
    [
        # The view authenticates, then subscribes: the second look finds the session ended meanwhile.
        ("/events/stream?channels=", "The session has ended."),
        # The stream opener subscribes first and checks the session in the opening: it was never verified.
        ("/events/stream", "The session has ended; log in again."),
    ],
)
def test_a_stream_whose_session_ends_while_it_subscribes_is_refused_and_holds_nothing(
    app, client, auth, rdb, path, message
):
    response, hub, user_id = start(app, client, auth, path, logout=False)
    assert response.status_code == 200  # the path streams when the session lives on
    response.close()

    response, hub, user_id = start(app, client, auth, path, logout=True)
    assert response.status_code == 401
    assert response.get_json()["error"] == {"code": "unauthorized", "message": message}
    assert hub.unsubscribed == hub.subscribed and len(hub.subscribed) == 1
    assert held_leases(rdb, user_id) == 0


def test_a_long_poll_whose_session_ends_while_it_subscribes_is_refused(app, client, auth, rdb):
    response, _, _ = start(app, client, auth, "/events/wait?timeout=0", logout=False)
    assert response.status_code == 204

    response, hub, user_id = start(app, client, auth, "/events/wait?timeout=0", logout=True)
    assert response.status_code == 401
    assert hub.unsubscribed == hub.subscribed and len(hub.subscribed) == 1
    assert held_leases(rdb, user_id) == 0


class UpgradedConnection:
    """Stands in for the WebSocket the view is given once the handshake is done: only its close is read."""

    def __init__(self):
        self.closed_with = None

    def close(self, code: int, reason: str) -> None:
        self.closed_with = (code, reason)


def test_a_websocket_whose_session_ends_while_it_subscribes_is_closed_as_ended(app, auth, rdb):
    tokens = auth.new_user_tokens()
    hub = app.extensions["event_hub"] = HubDuringALogout(logout=True)
    connection = UpgradedConnection()
    handshake = {"Upgrade": "websocket", "Connection": "Upgrade", **bearer(tokens["access_token"])}
    with app.test_request_context("/ws", headers=handshake):
        guard_websocket_handshake()  # authenticates and takes the lease, as before the upgrade
        app.view_functions["events.websocket"].__wrapped__(connection)  # the view inside flask-sock's
    assert connection.closed_with == (1008, "session ended")  # not 1011, "internal error"
    assert hub.unsubscribed == hub.subscribed and len(hub.subscribed) == 1
    assert held_leases(rdb, tokens["user"]["id"]) == 0
