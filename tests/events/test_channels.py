"""Named channels on every transport: `?channels=`, WebSocket frames, `from`, revocation within a second."""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
import time

import pytest
import requests
import websocket

from app.auth.users import create_user
from app.events.cursor import decode_cursor
from tests.events.clients import SSE, Api, open_connections, open_ws, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until
from tests.utils import DEFAULT_PASSWORD, random_email

MODE_FREE = pytest.mark.not_on_cluster("request parsing, cursors and rules: the same code whatever the Redis")
REVOKED_WITHIN = 1.0  # the promise: a revoked reader stops receiving the channel within a second
MARGIN = 2.0  # what a loaded test machine adds to it


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """Two workers, as in production, with every leave published at once: this module's presence tests count
    joins and leaves per user, and the linger (tests/channels/test_presence_linger.py's) would only delay them."""
    env = {**base_env, **FAST, "PRESENCE_LINGER_SECONDS": "0"}
    live = LiveServer(env, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


class Admin(Api):
    """An admin (made in Redis, logged in through the server) who defines namespaces and grants."""

    def put_namespace(self, name: str, **rules) -> None:
        body = {"publish": "server", **rules}
        response = self.http.put(f"{self.base}/admin/namespaces/{name}", json=body, headers=self.auth)
        assert response.status_code == 200, response.text

    def delete_namespace(self, name: str) -> None:
        assert self.http.delete(f"{self.base}/admin/namespaces/{name}", headers=self.auth).status_code == 204

    def grant(self, channel: str, user_id: str, **body) -> None:
        url = f"{self.base}/channels/{channel}/members/{user_id}"
        response = self.http.put(url, json=body, headers=self.auth)
        assert response.status_code == 204, response.text

    def revoke(self, channel: str, user_id: str) -> None:
        url = f"{self.base}/channels/{channel}/members/{user_id}"
        assert self.http.delete(url, headers=self.auth).status_code == 204


@pytest.fixture
def admin(server, app) -> Admin:
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    return Admin(server.url, email=email)


@pytest.fixture
def ns(admin) -> str:
    """A fresh namespace every logged-in user may read and publish to."""
    name = f"t{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="authenticated", publish="subscribers")
    return name


@pytest.fixture
def members_ns(admin) -> str:
    """A fresh namespace whose channels only granted users read; the server publishes."""
    name = f"m{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="members", publish="server")
    return name


def read_events(stream: SSE, count: int, timeout: float = 10.0) -> list[dict]:
    return [frame["data"] for frame in stream.events(count, timeout)]


def ws_until(ws, predicate, timeout: float = 10.0) -> dict:
    """The first frame that matches (frames before it are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        frame = ws_json(ws, max(0.05, deadline - time.monotonic()))
        if predicate(frame):
            return frame


# Subscribing


@MODE_FREE
def test_polling_and_long_polling_read_named_channels_beside_their_own(server, admin, ns):
    user = Api(server.url)
    room = f"{ns}:lobby"
    cursor = user.poll(channels=room).headers["Event-Cursor"]
    in_room = admin.publish_ok({"n": 1}, channel=room)
    own = user.publish_ok({"n": 2})
    body = user.poll(cursor, channels=room).json()
    assert [e["id"] for e in body["events"]] == [in_room, own]
    assert body["events"][0]["channel"] == room and body["events"][0]["from"] == admin.user_id
    assert decode_cursor(body["cursor"], [room, user.channel, "broadcast"])[room] == in_room

    waiting = user.wait(body["cursor"], channels=room, timeout=1)  # nothing new yet: a 204 after the wait
    assert waiting.status_code == 204
    later = admin.publish_ok({"n": 3}, channel=room)
    assert [e["id"] for e in user.wait(body["cursor"], channels=room).json()["events"]] == [later]


def test_sse_and_websocket_read_named_channels_live(server, admin, ns):
    user = Api(server.url)
    rooms = [f"{ns}:a", f"{ns}:b"]
    stream = SSE(server.url, user.auth, params={"channels": ",".join(rooms)})
    ws = open_ws(server.url, user.auth, params={"channels": ",".join(rooms)})
    try:
        assert stream.status == 200
        stream.next(skip_comments=False)
        assert ws_json(ws)["type"] == "welcome"
        ids = [admin.publish_ok({"room": room}, channel=room) for room in rooms]
        assert [e["id"] for e in read_events(stream, 2)] == ids
        frames = [ws_until(ws, lambda f: f["type"] == "event") for _ in ids]
        assert [(f["id"], f["channel"]) for f in frames] == list(zip(ids, rooms, strict=True))
        assert decode_cursor(frames[-1]["cursor"], rooms)[rooms[1]] == ids[1]
    finally:
        stream.close()
        ws.close()


@MODE_FREE
def test_a_resumed_reader_gets_what_it_missed_and_a_channel_its_cursor_lacks_starts_at_the_present(server, admin, ns):
    user = Api(server.url)
    first, second = f"{ns}:first", f"{ns}:second"
    cursor = user.poll(channels=first).headers["Event-Cursor"]
    missed = admin.publish_ok({"n": 1}, channel=first)
    admin.publish_ok({"n": 2}, channel=second)  # before the reader named `second`: not for it
    stream = SSE(server.url, user.auth, cursor=cursor, params={"channels": f"{first},{second}"})
    try:
        assert read_events(stream, 1)[0]["id"] == missed
        after = admin.publish_ok({"n": 3}, channel=second)
        assert read_events(stream, 1)[0]["id"] == after
    finally:
        stream.close()


@MODE_FREE
def test_the_cursor_of_a_hundred_channels_with_32_character_names_fits_in_4_kib(server, admin):
    user = Api(server.url)
    namespace = f"c{secrets.token_hex(3)}"
    admin.put_namespace(namespace, subscribe="authenticated")
    rooms = [f"{namespace}:{secrets.token_hex(16)[: 31 - len(namespace)]}" for _ in range(100)]
    assert all(len(room) == 32 for room in rooms)
    for room in rooms[:3]:
        admin.publish_ok({}, channel=room)
    body = requests.get(f"{server.url}/events", headers=user.auth, params={"channels": ",".join(rooms)}, timeout=10)
    assert body.status_code == 204
    cursor = body.headers["Event-Cursor"]
    assert len(cursor) <= 4096
    assert decode_cursor(cursor, rooms)[rooms[0]] != "0-0"
    later = admin.publish_ok({}, channel=rooms[99])
    resumed = user.poll(cursor, channels=",".join(rooms))  # the list and the cursor in one request line
    assert [e["id"] for e in resumed.json()["events"]] == [later]


@MODE_FREE
@pytest.mark.parametrize(
    ("channels", "status", "code"),
    [
        ("not a channel", 400, "bad_request"),
        ("a,,b", 400, "bad_request"),
        ("nosuchns:room", 404, "not_found"),
        ("MEMBERS:room", 403, "forbidden"),
    ],
)
def test_a_request_for_channels_it_may_not_read_is_refused_before_anything_is_held(
    server, admin, members_ns, channels, status, code
):
    user = Api(server.url)
    channels = channels.replace("MEMBERS", members_ns)
    for path in ("/events", "/events/wait", "/events/stream"):
        response = user.http.get(f"{server.url}{path}", params={"channels": channels}, headers=user.auth, timeout=10)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), path
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        open_ws(server.url, user.auth, params={"channels": channels})
    assert refused.value.status_code == status


@MODE_FREE
def test_more_named_channels_than_the_limit_is_422(server, admin, ns):
    user = Api(server.url)
    rooms = ",".join(f"{ns}:r{n}" for n in range(101))
    response = user.http.get(f"{server.url}/events", params={"channels": rooms}, headers=user.auth, timeout=10)
    assert response.status_code == 422 and response.json()["error"]["code"] == "validation_failed"
    hundred = ",".join(f"{ns}:r{n}" for n in range(100)) + f",{user.channel},broadcast"  # own channels count not
    assert user.http.get(f"{server.url}/events", params={"channels": hundred}, headers=user.auth).status_code == 204


# Publishing


@MODE_FREE
def test_from_is_the_publishing_user_set_by_the_service_and_absent_for_api_keys(server, admin, ns, app):
    from app.apikeys.store import create_key

    user = Api(server.url)
    room = f"{ns}:talk"
    cursor = user.poll(channels=room).headers["Event-Cursor"]
    body = {"channel": room, "event": "said", "data": "hi", "from": "someone-else"}
    assert user.http.post(f"{server.url}/events", json=body, headers=user.auth).status_code == 201
    with app.app_context():
        key, _ = create_key("publisher", ["events:publish"], [f"{ns}:*"])
    by_key = {"channel": room, "event": "said", "data": "by key"}
    response = requests.post(f"{server.url}/events", json=by_key, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 201
    events = user.poll(cursor, channels=room).json()["events"]
    assert [(e["data"], e.get("from")) for e in events] == [("hi", user.user_id), ("by key", None)]
    assert "from" not in events[1]


@MODE_FREE
def test_who_may_publish_follows_the_namespace(server, admin, members_ns, ns):
    user = Api(server.url)
    granted = f"{members_ns}:staff"
    admin.grant(granted, user.user_id)
    assert user.publish({"x": 1}, channel=granted).status_code == 403  # `server`: not users, even granted
    assert admin.publish({"x": 1}, channel=granted).status_code == 201
    assert user.publish({"x": 1}, channel=f"{ns}:open").status_code == 201  # `subscribers`
    assert user.publish({"x": 1}, channel="nosuchns:room").status_code == 404


# WebSocket frames


def test_websocket_frames_subscribe_publish_and_unsubscribe(server, admin, ns, members_ns):
    user = Api(server.url)
    room = f"{ns}:frames"
    ws = open_ws(server.url, user.auth)
    try:
        ws_json(ws)  # welcome
        ws.send(json.dumps({"type": "subscribe", "channel": room}))
        subscribed = ws_until(ws, lambda f: f["type"] != "pong")
        assert subscribed["type"] == "subscribed" and subscribed["channel"] == room
        assert room in decode_cursor(subscribed["cursor"], [room])

        ws.send(json.dumps({"type": "publish", "channel": room, "event": "said", "data": {"text": "hello"}}))
        ack = ws_until(ws, lambda f: f["type"] == "ack")
        event = ws_until(ws, lambda f: f["type"] == "event")
        assert (event["id"], event["channel"], event["from"]) == (ack["id"], room, user.user_id)

        ws.send(json.dumps({"type": "subscribe", "channel": f"{members_ns}:secret"}))
        error = ws_until(ws, lambda f: f["type"] == "error")
        assert (error["code"], error["channel"]) == ("forbidden", f"{members_ns}:secret")
        ws.send(json.dumps({"type": "subscribe", "channel": "bad name"}))
        assert ws_until(ws, lambda f: f["type"] == "error")["code"] == "bad_request"

        ws.send(json.dumps({"type": "unsubscribe", "channel": room}))
        assert ws_until(ws, lambda f: f["type"] == "unsubscribed") == {"type": "unsubscribed", "channel": room}
        admin.publish_ok({"after": "unsubscribe"}, channel=room)
        marker = user.publish_ok({"marker": True})  # own channel still read: proves delivery goes on
        assert ws_until(ws, lambda f: f["type"] == "event")["id"] == marker
    finally:
        ws.close()


@MODE_FREE
def test_a_subscribe_frame_with_a_cursor_resumes_that_channel(server, admin, ns):
    user = Api(server.url)
    room = f"{ns}:resume"
    cursor = user.poll(channels=room).headers["Event-Cursor"]
    missed = admin.publish_ok({"n": 1}, channel=room)
    ws = open_ws(server.url, user.auth)
    try:
        ws_json(ws)
        ws.send(json.dumps({"type": "subscribe", "channel": room, "cursor": cursor}))
        subscribed = ws_until(ws, lambda f: f["type"] == "subscribed")
        assert subscribed["channel"] == room
        # where the channel starts: a client that drops now and resumes from it still gets `missed`
        assert decode_cursor(subscribed["cursor"], [room])[room] == decode_cursor(cursor, [room])[room] != missed
        event = ws_until(ws, lambda f: f["type"] == "event")
        assert event["id"] == missed and decode_cursor(event["cursor"], [room])[room] == missed
    finally:
        ws.close()


# Revocation


def revoked_reader(transport: str, server, user: Api, room: str):
    """A live reader of `room` and a function that returns its next event or notice (a dict with `kind`)."""
    if transport == "sse":
        stream = SSE(server.url, user.auth, params={"channels": room})
        stream.next(skip_comments=False)

        def next_item(timeout=10.0):
            frame = stream.next_event(timeout)
            return {"kind": frame.get("event"), **frame["data"]}

        return stream.close, next_item
    ws = open_ws(server.url, user.auth, params={"channels": room})
    ws_json(ws)

    def next_ws(timeout=10.0):
        frame = ws_until(ws, lambda f: f["type"] in ("event", "unsubscribed"), timeout)
        return {"kind": frame["event"] if frame["type"] == "event" else "unsubscribed", **frame}

    return ws.close, next_ws


@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_a_revoked_grant_ends_the_channel_within_a_second_and_the_connection_goes_on(
    server, admin, members_ns, transport
):
    user = Api(server.url)
    room = f"{members_ns}:board"
    admin.grant(room, user.user_id)
    close, next_item = revoked_reader(transport, server, user, room)
    try:
        before = admin.publish_ok({"n": 1}, channel=room, event="update")
        assert next_item()["id"] == before  # the path delivers
        started = time.monotonic()
        admin.revoke(room, user.user_id)
        after = admin.publish_ok({"n": 2}, channel=room, event="update")  # published after the revocation
        notice = next_item()
        assert notice["kind"] == "unsubscribed" and (notice["channel"], notice["reason"]) == (room, "revoked")
        assert time.monotonic() - started < REVOKED_WITHIN + MARGIN
        marker = user.publish_ok({"marker": True})
        item = next_item()
        assert item["id"] == marker != after  # the later event of the room never came
    finally:
        close()


def test_a_held_long_poll_answers_when_its_channel_is_revoked(server, admin, members_ns):
    user = Api(server.url)
    room = f"{members_ns}:poll"
    admin.grant(room, user.user_id)
    cursor = user.poll(channels=room).headers["Event-Cursor"]
    result = {}

    def hold():
        result["response"] = user.wait(cursor, channels=room, timeout=20)

    holder = threading.Thread(target=hold)
    holder.start()
    wait_until(lambda: open_connections(server.url, "long_poll") >= 1, message="a held long poll")
    started = time.monotonic()
    admin.revoke(room, user.user_id)
    holder.join(15)
    assert not holder.is_alive() and time.monotonic() - started < REVOKED_WITHIN + MARGIN
    assert result["response"].status_code == 204


def test_an_expired_grant_ends_the_channel_with_reason_expired(server, admin, members_ns):
    user = Api(server.url)
    room = f"{members_ns}:brief"
    granted_at = time.monotonic()
    admin.grant(room, user.user_id, expires_in=2)
    close, next_item = revoked_reader("sse", server, user, room)
    try:
        published = admin.publish_ok({}, channel=room)
        assert next_item()["id"] == published  # the path delivers
        notice = next_item(timeout=10)
        assert (notice["kind"], notice["reason"]) == ("unsubscribed", "expired")
        assert 1.5 <= time.monotonic() - granted_at < 2 + REVOKED_WITHIN + MARGIN
    finally:
        close()


@pytest.mark.parametrize(("change", "reason"), [("delete", "namespace_deleted"), ("members", "access_changed")])
def test_a_namespace_deleted_or_closed_to_members_takes_its_channels(server, admin, change, reason):
    user = Api(server.url)
    name = f"n{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="authenticated")
    room = f"{name}:hall"
    close, next_item = revoked_reader("websocket", server, user, room)
    try:
        published = admin.publish_ok({}, channel=room)
        assert next_item()["id"] == published
        if change == "delete":
            admin.delete_namespace(name)
        else:
            admin.put_namespace(name, subscribe="members")
        notice = next_item()
        assert (notice["kind"], notice["channel"], notice["reason"]) == ("unsubscribed", room, reason)
    finally:
        close()


@MODE_FREE
def test_the_cursor_after_a_revocation_no_longer_names_the_channel(server, admin, members_ns):
    user = Api(server.url)
    room = f"{members_ns}:gone"
    admin.grant(room, user.user_id)
    ws = open_ws(server.url, user.auth, params={"channels": room})
    try:
        ws_json(ws)
        admin.revoke(room, user.user_id)
        ws_until(ws, lambda f: f["type"] == "unsubscribed")
        marker = user.publish_ok({})
        frame = ws_until(ws, lambda f: f["type"] == "event")
        assert frame["id"] == marker
        assert decode_cursor(frame["cursor"], [room])[room] == "0-0"  # not named: it would start afresh
    finally:
        ws.close()


# Presence through the transports


def presence_of(user: Api, channel: str) -> dict:
    response = user.http.get(f"{user.base}/channels/{channel}/presence", headers=user.auth, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def presence_events(watcher: SSE, count: int) -> list[tuple[str, str]]:
    return [(e["event"], e["data"]["user_id"]) for e in read_events(watcher, count)]


def test_join_and_leave_come_once_per_user_however_many_connections_it_holds(server, admin):
    name = f"p{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="authenticated", publish="subscribers", presence=True, join_leave=True)
    room = f"{name}:room"
    alice, bob = Api(server.url), Api(server.url)
    watcher = SSE(server.url, admin.auth, params={"channels": room})  # an admin reading counts too
    try:
        assert presence_events(watcher, 1) == [("presence.join", admin.user_id)]
        stream = SSE(server.url, alice.auth, params={"channels": room})
        ws = open_ws(server.url, alice.auth, params={"channels": room})
        ws_json(ws)
        assert presence_events(watcher, 1) == [("presence.join", alice.user_id)]
        bob_ws = open_ws(server.url, bob.auth)
        ws_json(bob_ws)
        bob_ws.send(json.dumps({"type": "subscribe", "channel": room}))
        ws_until(bob_ws, lambda f: f["type"] == "subscribed")
        assert presence_events(watcher, 1) == [("presence.join", bob.user_id)]

        seen = wait_until(lambda: (p := presence_of(bob, room))["count"] == 3 and p, message="three present")
        by_user = {u["user_id"]: u["connections"] for u in seen["users"]}
        assert by_user == {admin.user_id: 1, alice.user_id: 2, bob.user_id: 1}
        assert [u["user_id"] for u in seen["users"]] == sorted(by_user)

        stream.close()  # alice is still here by her WebSocket: no leave
        wait_until(
            lambda: {u["user_id"]: u["connections"] for u in presence_of(bob, room)["users"]}[alice.user_id] == 1
        )
        bob_ws.send(json.dumps({"type": "unsubscribe", "channel": room}))
        assert presence_events(watcher, 1) == [("presence.leave", bob.user_id)]
        ws.close()
        assert presence_events(watcher, 1) == [("presence.leave", alice.user_id)]
        assert presence_of(admin, room)["count"] == 1
        bob_ws.close()
    finally:
        watcher.close()


@MODE_FREE
def test_a_user_reads_the_presence_of_a_channel_it_may_read_only(server, admin):
    name = f"q{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="members", presence=True)
    user, other = Api(server.url), Api(server.url)
    admin.grant(f"{name}:x", user.user_id)
    assert presence_of(user, f"{name}:x")["count"] == 0
    assert other.http.get(f"{server.url}/channels/{name}:x/presence", headers=other.auth).status_code == 403


def test_the_users_of_a_worker_that_died_leave_within_the_presence_timeout(start_server, admin, app):
    # Presence keys outlive their last renewal by a lease and a timeout (here 3 + 5 s): enough for the new
    # worker to boot and reap on a busy machine (with 2 s, a slow boot let them expire unreaped: no leave).
    timeout = 5
    live = start_server(workers=1, PRESENCE_TIMEOUT_SECONDS=str(timeout), PRESENCE_LINGER_SECONDS="0")
    name = f"d{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="authenticated", presence=True, join_leave=True)
    room = f"{name}:room"
    user = Api(live.url)
    cursor = user.poll(channels=room).headers["Event-Cursor"]
    stream = SSE(live.url, user.auth, params={"channels": room})
    try:
        wait_until(lambda: presence_of(user, room)["count"] == 1, message="present")
        (worker,) = live.worker_pids()
        os.kill(worker, signal.SIGKILL)  # no goodbye: only the lease can end its presence
        killed_at = time.monotonic()
        wait_until(lambda: requests.get(f"{live.url}/healthz", timeout=2).ok, timeout=30, message="a new worker")
        reaping_from = max(time.monotonic(), killed_at + timeout)  # a worker to reap, and the lease's end
        wait_until(lambda: presence_of(user, room)["count"] == 0, timeout=15, message="left")
        assert time.monotonic() - reaping_from < 1 + MARGIN
        events = user.poll(cursor, channels=room).json()["events"]
        assert [(e["event"], e["data"]["user_id"]) for e in events] == [
            ("presence.join", user.user_id),
            ("presence.leave", user.user_id),
        ]
    finally:
        stream.close()
