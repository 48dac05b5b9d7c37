"""Access that ends while a subscription is being opened still ends: a grant revoked, or an admin demoted, after
the subscription's access check and before the subscription is in force (when the revocation's message reaches
no one) takes the channel, or the connection, as a revocation or a role change does later. Nothing published
after the revocation reaches the reader on that channel: neither history its opening reads nor live events.

A real gunicorn whose worker does the revocation (or demotion) at exactly that moment (race_worker.py), on
`?channels=` of SSE, WebSocket and long polling, and on a WebSocket subscribe frame. Each test first walks the
same path without the race and sees the event arrive.
"""

from __future__ import annotations

import json
import secrets
import threading

import pytest
import redis

from app.auth.users import create_user
from app.channels import grants
from app.events.bus import wake_channel
from app.events.cursor import decode_cursor
from tests.channels.race_worker import RACE_EVENT, RACE_KEY, RACE_WORKER
from tests.events.clients import SSE, Api, open_connections, open_ws, ws_close_code, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until
from tests.utils import DEFAULT_PASSWORD, random_email


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """One worker that races as asked (race_worker.py)."""
    live = LiveServer(
        {**base_env, **FAST, **RACE_WORKER}, workers=1, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log"
    )
    live.start()
    yield live
    live.stop()


class Admin(Api):
    """An admin (made in Redis, logged in through the server) who defines namespaces, grants and publishes."""

    def put_namespace(self, name: str, **rules) -> None:
        body = {"publish": "server", **rules}
        response = self.http.put(f"{self.base}/admin/namespaces/{name}", json=body, headers=self.auth)
        assert response.status_code == 200, response.text

    def grant(self, channel: str, user_id: str) -> None:
        response = self.http.put(f"{self.base}/channels/{channel}/members/{user_id}", json={}, headers=self.auth)
        assert response.status_code == 204, response.text


def new_admin(app, base: str) -> Admin:
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    return Admin(base, email=email)


@pytest.fixture
def admin(server, app) -> Admin:
    return new_admin(app, server.url)


@pytest.fixture
def room(admin) -> str:
    """A channel of a fresh `members` namespace."""
    name = f"m{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="members")
    return f"{name}:board"


def wake_subscribers(redis_server, rdb, channel: str) -> int:
    """How many connections Redis holds subscribed to the channel's wake-ups (on a cluster: sharded)."""
    if redis_server.mode == "cluster":
        nodes = [redis.Redis("127.0.0.1", port) for port in redis_server.primaries()]
        return sum(int(node.execute_command("PUBSUB", "SHARDNUMSUB", wake_channel(channel))[1]) for node in nodes)
    return rdb.pubsub_numsub(wake_channel(channel))[0][1]


@pytest.fixture
def race(redis_server, rdb):
    """Have the user's next subscription's access check be followed at once by these actions (race_worker.py),
    once the worker no longer reads `room` (so a revocation's message reaches no one)."""

    def ask(user_id: str, room: str, *actions: dict) -> None:
        wait_until(lambda: wake_subscribers(redis_server, rdb, room) == 0, message="the worker to leave the room")
        rdb.set(RACE_KEY.format(user_id), json.dumps(list(actions)))

    return ask


def granted_reader(server, admin: Admin, room: str) -> tuple[Api, str]:
    """A user granted `room`, and a cursor that names the room at the present."""
    user = Api(server.url)
    admin.grant(room, user.user_id)
    return user, user.poll(channels=room).headers["Event-Cursor"]


def sse_items(stream: SSE):
    """The stream's next event or notice: (SSE event name, data)."""

    def next_item(timeout: float = 10.0) -> tuple[str, dict]:
        frame = stream.next_event(timeout)
        return frame.get("event"), frame["data"]

    return next_item


def ws_items(ws):
    """The WebSocket's next event, notice or answer: (type or event name, frame), pings and pongs skipped."""

    def next_item(timeout: float = 10.0) -> tuple[str, dict]:
        frame = ws_json(ws, timeout)
        return (frame["event"] if frame["type"] == "event" else frame["type"]), frame

    return next_item


def later_events_stay_away(admin: Admin, user: Api, room: str, next_item) -> None:
    """An event of the room published now never comes: the user's own event published after it comes first."""
    after = admin.publish_ok({"n": "after"}, channel=room, event="after")
    marker = user.publish_ok({"marker": True}, event="marker")
    kind, item = next_item()
    assert (kind, item["id"]) == ("marker", marker), f"{kind}: {item} (the room's event {after} came)"


# ?channels= on SSE and WebSocket


@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_a_grant_revoked_while_the_connection_opens_takes_the_channel(server, admin, room, race, transport):
    user, cursor = granted_reader(server, admin, room)

    def connect(cursor: str):
        if transport == "sse":
            stream = SSE(server.url, user.auth, cursor=cursor, params={"channels": room})
            assert stream.status == 200
            return stream.close, sse_items(stream)
        ws = open_ws(server.url, user.auth, cursor=cursor, params={"channels": room})
        assert ws_json(ws)["type"] == "welcome"
        return ws.close, ws_items(ws)

    close, next_item = connect(cursor)  # without the race, the path delivers
    try:
        published = admin.publish_ok({"n": 1}, channel=room, event="before")
        assert next_item()[1]["id"] == published
    finally:
        close()

    # Revoked once the access check answered; an event published after it waits in the room's history.
    cursor = user.poll(channels=room).headers["Event-Cursor"]
    race(user.user_id, room, {"revoke": room}, {"publish": room})
    close, next_item = connect(cursor)
    try:
        kind, notice = next_item()
        assert kind == "unsubscribed", f"{kind}: {notice}"  # not the event said after the revocation
        assert (notice["channel"], notice["reason"]) == (room, "revoked")
        later_events_stay_away(admin, user, room, next_item)
    finally:
        close()


# Long polling


def held_long_poll(server, user: Api, cursor: str, room: str) -> tuple[threading.Thread, dict]:
    """A long poll of the room (answered on a thread), once the server holds it or has answered it."""
    result: dict = {}

    def hold():
        result["response"] = user.wait(cursor, channels=room, timeout=15)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    wait_until(lambda: "response" in result or open_connections(server.url, "long_poll") >= 1, message="a long poll")
    return holder, result


def test_a_long_poll_whose_grant_is_revoked_while_it_opens_answers_as_on_time_out(server, admin, room, race):
    user, cursor = granted_reader(server, admin, room)
    holder, result = held_long_poll(server, user, cursor, room)  # without the race, the path delivers
    published = admin.publish_ok({"n": 1}, channel=room)
    holder.join(15)
    assert [event["id"] for event in result["response"].json()["events"]] == [published]
    cursor = result["response"].headers["Event-Cursor"]

    race(user.user_id, room, {"revoke": room})
    holder, result = held_long_poll(server, user, cursor, room)
    admin.publish_ok({"n": "after"}, channel=room)  # after the revocation: it never reaches the poll
    holder.join(15)
    answer = result["response"]
    assert answer.status_code == 204, answer.text
    assert decode_cursor(answer.headers["Event-Cursor"], [room])[room] == "0-0"  # the room is no longer named

    admin.grant(room, user.user_id)
    race(user.user_id, room, {"revoke": room}, {"publish": room})  # nor what the opening reads of the history
    answer = user.wait(cursor, channels=room, timeout=15)
    assert answer.status_code == 204, answer.text


# A WebSocket subscribe frame


def test_a_grant_revoked_while_a_subscribe_frame_is_answered_is_refused(server, admin, room, race):
    user, cursor = granted_reader(server, admin, room)
    ws = open_ws(server.url, user.auth)
    next_item = ws_items(ws)
    try:
        assert next_item()[0] == "welcome"
        ws.send(json.dumps({"type": "subscribe", "channel": room}))  # without the race, the path delivers
        assert next_item()[0] == "subscribed"
        published = admin.publish_ok({"n": 1}, channel=room)
        assert next_item()[1]["id"] == published
        ws.send(json.dumps({"type": "unsubscribe", "channel": room}))
        assert next_item()[0] == "unsubscribed"

        race(user.user_id, room, {"revoke": room}, {"publish": room})
        ws.send(json.dumps({"type": "subscribe", "channel": room, "cursor": cursor}))
        kind, answer = next_item()
        assert kind == "error", f"{kind}: {answer}"  # not `subscribed`, nor the event said after the revocation
        assert (answer["code"], answer["channel"]) == ("forbidden", room)
        later_events_stay_away(admin, user, room, next_item)
    finally:
        ws.close()


# An admin demoted while its WebSocket opens


def test_an_admin_demoted_while_its_websocket_opens_is_closed_as_a_role_change_closes_it(server, app, admin, race):
    name = f"m{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="members")
    room = f"{name}:staff"  # no grants: only admins read it
    reader = new_admin(app, server.url)
    ws = open_ws(server.url, reader.auth, params={"channels": room})  # without the race, the path delivers
    try:
        welcome = ws_json(ws)
        assert welcome["type"] == "welcome" and welcome["user"]["role"] == "admin"
        published = admin.publish_ok({"n": 1}, channel=room)
        assert ws_json(ws)["id"] == published
    finally:
        ws.close()

    race(reader.user_id, room, {"demote": True})
    ws = open_ws(server.url, reader.auth, params={"channels": room})
    try:
        assert ws_close_code(ws) == 1008  # as a role change closes a connection: it reconnects as what it is now
    finally:
        ws.close()
    assert reader.poll(channels=room).status_code == 403  # as what it is now, a user may not read the room


def test_a_race_action_runs_once(server, admin, room, race, rdb):
    """The harness itself: the actions run at the next access check only."""
    user, _ = granted_reader(server, admin, room)
    race(user.user_id, room, {"publish": room})
    assert user.poll(channels=room).status_code in (200, 204)
    assert rdb.get(RACE_KEY.format(user.user_id)) is None
    history = user.poll(decode_cursor_at_start(room, user), channels=room).json()["events"]
    assert [event["event"] for event in history] == [RACE_EVENT]


def decode_cursor_at_start(room: str, user: Api) -> str:
    """A cursor that names the room (and the user's channels) before anything was said in it."""
    from app.events.cursor import cursor_writer

    channels = [user.channel, "broadcast", room]
    return cursor_writer(channels, compact=True)(dict.fromkeys(channels, "0-0"))


# A revocation while a long history is read (in process: a poll reading more than one batch)


def test_a_grant_revoked_while_a_long_history_is_read_stops_it_there(
    app, client, new_user, namespace, granted, monkeypatch
):
    namespace("chat")
    user, room = new_user(), "chat:long"
    granted(room, user["id"])
    bus, store = app.extensions["event_bus"], app.extensions["redis"]
    query = {"channels": room, "cursor": poll_cursor(client, user, room), "limit": 1000}
    for hundred in range(6):  # more than one batch of history (HISTORY_BATCH, 500)
        bus.publish_many([(room, "said", {"n": hundred * 100 + n}) for n in range(100)])

    def before_the_second_read(action):
        reads = []
        for name in ("opening", "read_after"):  # whichever reads the second batch
            read = getattr(bus, name)

            def counted(*args, _read=read, **kwargs):
                reads.append(1)
                if len(reads) == 2:
                    action()
                return _read(*args, **kwargs)

            monkeypatch.setattr(bus, name, counted)

    before_the_second_read(lambda: bus.publish(room, "later", {}))  # without the revocation, the path reads on
    read = client.get("/events", query_string=query, headers=user["headers"]).get_json()["events"]
    assert [e["event"] for e in read] == ["said"] * 600 + ["later"]

    monkeypatch.undo()
    before_the_second_read(lambda: (grants.revoke(store, room, user["id"]), bus.publish(room, "after", {})))
    read = client.get("/events", query_string=query, headers=user["headers"]).get_json()["events"]
    assert "after" not in [e["event"] for e in read]  # the first batch, read before the revocation, may come


def poll_cursor(client, user: dict, room: str) -> str:
    return client.get("/events", query_string={"channels": room}, headers=user["headers"]).headers["Event-Cursor"]
