"""Each transport delivers, with the exact wire format of docs/api.md (Events)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import websocket

from app.channels.namespaces import Namespace, put_namespace
from app.events.sse import sse_frame
from tests.events.clients import SSE, Api, open_connections, open_ws, parse_block, ws_close_code, ws_json
from tests.servers import wait_until

E_FIELDS = {"id", "channel", "event", "data", "ts", "from"}  # `from`: published with a user's access token


# Server-sent events


@pytest.fixture
def room_after_history(server, rdb) -> tuple:
    """A user, a publisher, a fresh room of an open namespace, and the user's cursor from before an event of its
    own: it names the user's channels, not the room."""
    put_namespace(rdb, Namespace("lounge", "authenticated", "subscribers"))
    user, publisher = Api(server.url), Api(server.url)
    before = user.current_cursor()
    user.publish_ok({"n": "old"})  # history after that cursor
    return user, publisher, f"lounge:r{time.monotonic_ns()}", before


def test_sse_response_headers_and_opening(server):
    user = Api(server.url)
    stream = SSE(server.url, {**user.auth, "Accept-Encoding": "gzip, br"})
    try:
        assert stream.status == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        assert stream.headers["Cache-Control"] == "no-cache"
        assert stream.headers["Connection"] == "keep-alive"
        assert stream.headers["X-Accel-Buffering"] == "no"
        assert "Content-Encoding" not in stream.headers  # never compressed, even when offered
        opening = stream.next(skip_comments=False)
        assert opening["retry"].isdigit() and opening["comment"]
        assert stream.raw.startswith("retry: ")
    finally:
        stream.close()


def test_an_sse_stream_resumed_from_its_opening_start_misses_nothing_of_a_channel_its_cursor_did_not_name(
    server, room_after_history
):
    """The opening comment's `start <cursor>` is where the stream began reading: before the history it sends, and
    a named channel the cursor did not cover at the present then. The history's last `id:` stands after it."""
    user, publisher, room, before = room_after_history
    stream = SSE(server.url, user.auth, cursor=before, params={"channels": room})
    opening = stream.next(skip_comments=False)
    last_id = stream.next_event()["id"]
    stream.close()  # gone after its history: as a connection dropped at once
    [comment] = opening["comment"]  # a retry: line and one comment, which says where the stream started
    assert "retry" in opening and comment.startswith("stream open, start ")
    start = comment.removeprefix("stream open, start ")
    publisher.publish_ok({"n": "gap"}, channel=room)  # while it was away, in the room it had joined

    def resumed(cursor: str) -> list:
        again = SSE(server.url, user.auth, cursor=cursor, params={"channels": room})
        try:
            return [again.next_event()["data"]["data"]["n"] for _ in range(2 if cursor == start else 1)]
        finally:
            again.close()

    assert resumed(start) == ["old", "gap"]
    assert resumed(last_id) == ["gap"]  # after the history it sent
    # What a client that kept its own cursor until the first event would lose: the room starts at the present.
    assert [e["data"]["n"] for e in user.poll(before, channels=room).json()["events"]] == ["old"]


def test_sse_event_frame_is_id_event_data_then_blank_line(server):
    user = Api(server.url)
    stream = SSE(server.url, user.auth)
    try:
        stream.next(skip_comments=False)  # opening: the subscription is live once the stream has started
        event_id = user.publish_ok({"text": "hello\nworld", "n": 1}, event="greeting")
        frame = stream.next_event()
        assert set(frame) == {"id", "event", "data"}
        assert frame["event"] == "greeting"
        assert frame["data"]["data"] == {"text": "hello\nworld", "n": 1}
        assert set(frame["data"]) == E_FIELDS and frame["data"]["id"] == event_id
        assert frame["data"]["channel"] == user.channel and frame["data"]["ts"].endswith("Z")
        block = f"id: {frame['id']}\nevent: greeting\ndata: "
        assert block in stream.raw
        assert stream.raw[stream.raw.index(block) :].split("\n\n")[0].count("\n") == 2  # 3 lines, then blank
    finally:
        stream.close()


def test_sse_heartbeat_comments_arrive_on_an_idle_stream(server):
    user = Api(server.url)
    stream = SSE(server.url, user.auth)
    try:
        stream.next(skip_comments=False)
        started = time.monotonic()
        pings = [stream.next(timeout=3, skip_comments=False) for _ in range(2)]
        assert all(p == {"comment": ["ping"]} for p in pings)
        assert time.monotonic() - started < 2.5  # SSE_HEARTBEAT_SECONDS=0.5 in these tests
        assert ": ping\n\n" in stream.raw
    finally:
        stream.close()


def test_sse_frame_splits_multiline_data_safely():
    frame = sse_frame("line one\nline two\r\nline three", "note", "c1")
    assert frame == "id: c1\nevent: note\ndata: line one\ndata: line two\ndata: line three\n\n"
    assert parse_block(frame.rstrip("\n"))["data"] == "line one\nline two\nline three"


def test_sse_without_token_is_a_json_401(server):
    stream = SSE(server.url, {})
    assert stream.status == 401
    assert json.loads(stream.body)["error"]["code"] == "unauthorized"


def test_sse_with_malformed_cursor_is_400(server):
    user = Api(server.url)
    stream = SSE(server.url, user.auth, cursor="not a cursor!")
    assert stream.status == 400


# Polling


def test_polling_answers_at_once_with_204_and_a_cursor_when_nothing_is_new(server):
    user = Api(server.url)
    started = time.monotonic()
    response = user.poll()
    assert response.status_code == 204 and response.content == b""
    assert response.headers["Event-Cursor"]
    assert time.monotonic() - started < 1


def test_polling_returns_new_events_and_the_cursor_after_them(server):
    user = Api(server.url)
    cursor = user.current_cursor()
    ids = [user.publish_ok({"n": n}) for n in range(3)]
    response = user.poll(cursor)
    assert response.status_code == 200
    body = response.json()
    assert [e["id"] for e in body["events"]] == ids
    assert all(set(e) == E_FIELDS and e["from"] == user.user_id for e in body["events"])
    assert response.headers["Event-Cursor"] == body["cursor"]
    assert user.poll(body["cursor"]).status_code == 204


def test_polling_limit_pages_through_events(server):
    user = Api(server.url)
    cursor = user.current_cursor()
    ids = [user.publish_ok({"n": n}) for n in range(5)]
    first = user.poll(cursor, limit=2).json()
    rest = user.poll(first["cursor"], limit=10).json()
    assert [e["id"] for e in first["events"] + rest["events"]] == ids


@pytest.mark.parametrize("params", [{"cursor": "%%%"}, {"limit": "0"}, {"limit": "many"}, {"limit": "5000"}])
def test_polling_bad_query_is_400(server, params):
    user = Api(server.url)
    response = user.http.get(f"{server.url}/events", params=params, headers=user.auth)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


# Long polling


def test_long_poll_answers_within_100ms_of_a_publish(server):
    user = Api(server.url)
    cursor = user.current_cursor()
    answered = {}

    def wait():
        response = user.wait(cursor, timeout=10)
        answered["at"], answered["response"] = time.monotonic(), response

    waiter = threading.Thread(target=wait)
    waiter.start()
    publisher = Api(server.url, email=user.email)  # logged in before the clock starts: a hash takes its time
    wait_until(lambda: open_connections(server.url, "long_poll") >= 1, message="the long poll to be held")
    published_at = time.monotonic()
    publisher.publish_ok({"late": True})
    waiter.join(10)
    assert answered["response"].status_code == 200
    assert answered["response"].json()["events"][0]["data"] == {"late": True}
    assert answered["at"] - published_at < 0.1


def test_long_poll_holds_until_its_timeout_when_nothing_comes(server):
    user, other = Api(server.url), Api(server.url)
    cursor = user.current_cursor()
    # Proof the path delivers: the other user's own long poll is answered by its own event.
    other_cursor = other.current_cursor()
    other.publish_ok({"for": "other"})
    assert other.wait(other_cursor, timeout=1).status_code == 200

    started = time.monotonic()
    response = user.wait(cursor, timeout=1.5)
    held = time.monotonic() - started
    assert response.status_code == 204 and response.headers["Event-Cursor"]
    assert 1.4 <= held < 3.0


def test_long_poll_timeout_is_bounded(server):
    user = Api(server.url)
    assert user.wait(timeout=10_000).status_code == 400
    assert user.wait(timeout="soon").status_code == 400


# WebSocket


def test_websocket_welcome_event_ack_pong_and_errors(server):
    user = Api(server.url)
    ws = open_ws(server.url, user.auth)
    try:
        welcome = ws_json(ws)
        assert welcome["type"] == "welcome" and welcome["cursor"]
        assert welcome["user"] == {
            "id": user.user_id,
            "email": user.email,
            "role": "user",
            "email_verified": False,
            "mfa_enabled": False,
        }
        event_id = user.publish_ok({"via": "http"}, event="note")
        frame = ws_json(ws)
        assert frame["type"] == "event" and frame["id"] == event_id and frame["event"] == "note"
        assert frame["data"] == {"via": "http"} and frame["channel"] == user.channel and frame["cursor"]
        assert set(frame) >= E_FIELDS

        ws.send(json.dumps({"type": "ping"}))
        assert ws_json(ws) == {"type": "pong"}

        ws.send(json.dumps({"type": "publish", "event": "typed", "data": [1, 2]}))
        replies = [ws_json(ws), ws_json(ws)]  # the ack and the event itself, in either order
        ack = next(r for r in replies if r["type"] == "ack")
        echoed = next(r for r in replies if r["type"] == "event")
        assert ack["id"] == echoed["id"] and echoed["data"] == [1, 2]

        for bad in ("not json", json.dumps([1]), json.dumps({"type": "dance"}), json.dumps({"type": "publish"})):
            ws.send(bad)
            error = ws_json(ws)
            assert error["type"] == "error" and error["code"] == "bad_request" and error["message"]
        ws.send(json.dumps({"type": "ping"}))  # the connection lives on after bad frames
        assert ws_json(ws) == {"type": "pong"}
    finally:
        ws.close()


def test_a_websocket_protocol_ping_is_answered_with_its_pong(server):
    user = Api(server.url)
    ws = open_ws(server.url, user.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        ws.ping("are you there")
        opcode, frame = ws.recv_data_frame(control_frame=True)
        assert opcode == websocket.ABNF.OPCODE_PONG and frame.data == b"are you there"
    finally:
        ws.close()


def test_websocket_frame_over_64_kib_closes_with_1009(server):
    user = Api(server.url)
    ws = open_ws(server.url, user.auth)
    ws_json(ws)
    ws.send(json.dumps({"type": "publish", "event": "big", "data": "x" * 1000}))
    assert {ws_json(ws)["type"], ws_json(ws)["type"]} == {"ack", "event"}  # a normal frame is fine
    ws.send("x" * (64 * 1024 + 1))
    assert ws_close_code(ws) == 1009


def test_websocket_handshake_without_credentials_is_401(server):
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        open_ws(server.url, {})
    assert refused.value.status_code == 401


def test_websocket_handshake_with_cookie_from_foreign_origin_is_403(server):
    user = Api(server.url)
    cookie = {"Cookie": f"__Host-access={user.access_token}"}
    # Proof the cookie handshake works from our own origin ...
    ws = open_ws(server.url, {**cookie, "Origin": server.url})
    assert ws_json(ws)["type"] == "welcome"
    ws.close()
    # ... and is refused before the upgrade from another one.
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        open_ws(server.url, {**cookie, "Origin": "http://evil.example"})
    assert refused.value.status_code == 403


def test_websocket_with_bearer_is_not_origin_checked(server):
    user = Api(server.url)
    ws = open_ws(server.url, {**user.auth, "Origin": "http://other.example"})
    assert ws_json(ws)["type"] == "welcome"
    ws.close()


# Publishing


def test_publish_rules_and_limits(server):
    user, other = Api(server.url), Api(server.url)
    assert user.publish({"a": 1}).status_code == 201
    assert user.publish({"a": 1}, channel=other.channel).status_code == 403
    assert user.publish({"a": 1}, channel="broadcast").status_code == 403
    assert user.publish("x" * (64 * 1024)).status_code == 413
    assert user.publish({"a": 1}, event="bad name with spaces").status_code == 422
    response = user.http.post(f"{server.url}/events", json={"event": "x"}, headers=user.auth)
    assert response.status_code == 400


def test_a_websocket_resumed_from_its_welcomes_start_misses_nothing_of_a_channel_its_cursor_did_not_name(
    server, room_after_history
):
    """The welcome's `start` is where the connection began reading: before the history it sends, and a named
    channel the cursor did not cover at the present then. Its `cursor` stands after that history."""
    user, publisher, room, before = room_after_history
    ws = open_ws(server.url, user.auth, cursor=before, params={"channels": room})
    welcome = ws_json(ws)
    ws.close()  # gone before reading anything: as a connection dropped at once
    publisher.publish_ok({"n": "gap"}, channel=room)  # while it was away, in the room it had joined

    def resumed(cursor: str) -> list:
        again = open_ws(server.url, user.auth, cursor=cursor, params={"channels": room})
        try:
            assert ws_json(again)["type"] == "welcome"
            return [ws_json(again)["data"]["n"] for _ in range(2 if cursor == welcome["start"] else 1)]
        finally:
            again.close()

    assert resumed(welcome["start"]) == ["old", "gap"]
    assert resumed(welcome["cursor"]) == ["gap"]  # after the history it was about to send


def test_each_subscribed_frame_is_followed_by_its_history_and_its_cursor_resumes_what_came_after_it(server, rdb):
    """Two subscribe frames in one write: each answer goes out with the history it queued before the next frame
    is read, so each `subscribed` cursor covers what was sent before it, and resuming from it yields the rest."""
    put_namespace(rdb, Namespace("lounge", "authenticated", "subscribers"))
    user, publisher = Api(server.url), Api(server.url)
    rooms = [f"lounge:x{time.monotonic_ns()}", f"lounge:y{time.monotonic_ns()}"]
    before = user.poll(channels=",".join(rooms)).headers["Event-Cursor"]  # names both rooms, before their history
    for room in rooms:
        publisher.publish_ok({"n": room}, channel=room)
    ws = open_ws(server.url, user.auth)
    assert ws_json(ws)["type"] == "welcome"
    frames = [json.dumps({"type": "subscribe", "channel": room, "cursor": before}) for room in rooms]
    ws.sock.sendall(b"".join(websocket.ABNF.create_frame(f, websocket.ABNF.OPCODE_TEXT).format() for f in frames))
    wire = [ws_json(ws) for _ in range(4)]
    ws.close()
    assert [(f["type"], f["channel"]) for f in wire] == [
        ("subscribed", rooms[0]), ("event", rooms[0]), ("subscribed", rooms[1]), ("event", rooms[1])
    ]  # fmt: skip
    for index, frame in enumerate(wire):
        if frame["type"] == "subscribed":
            followed = rooms[: rooms.index(frame["channel"]) + 1]
            after = [f["data"]["n"] for f in wire[index:] if f["type"] == "event" and f["channel"] in followed]
            resumed = user.poll(frame["cursor"], channels=",".join(followed)).json()["events"]
            assert [event["data"]["n"] for event in resumed] == after
