"""Hostile input and abuse on live connections: WebSocket frames and cursors, and the per-user cap."""

from __future__ import annotations

import base64
import json
import threading

import pytest
import websocket

from tests.events.clients import SSE, Api, open_connections, open_ws, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until

CAP = "3"  # live connections per user


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """Two workers, as in production, that cap a user's live connections at three (each other test of the
    module holds one at most)."""
    env = {**base_env, **FAST, "MAX_CONNECTIONS_PER_USER": CAP}
    live = LiveServer(env, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.mark.not_on_cluster("frames and cursors are parsed the same whatever the Redis")
def test_hostile_frames_get_error_frames_and_the_socket_stays_usable(server):
    user = Api(server.url)
    cursor = user.current_cursor()
    ws = open_ws(server.url, user.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        hostile = [
            "[" * 5000 + "]" * 5000,
            '{"type": "publish", "event": "x", "data": ' + "[" * 40 + "]" * 40 + "}",
            '{"type": "publish", "event": "x", "data": NaN}',
            '{"type": "publish", "event": "x", "data": Infinity}',
            '{"type": "publish", "event": "x", "data": "\\ud800"}',
            '{"type": "publish", "event": "x\\u001b", "data": 1}',
            '{"type": "publish", "event": "x\\n", "data": 1}',
            "not json",
        ]
        for frame in hostile:
            ws.send(frame)
            reply = ws_json(ws)
            assert reply["type"] == "error" and reply["code"] in ("bad_request", "validation_failed"), (frame, reply)
        ws.send(json.dumps({"type": "publish", "event": "still.fine", "data": {"ok": True}}))
        replies = [ws_json(ws), ws_json(ws)]  # the ack and the event itself, in either order
        assert {r["type"] for r in replies} == {"ack", "event"}
    finally:
        ws.close()
    assert [e["event"] for e in user.poll(cursor).json()["events"]] == ["still.fine"]  # nothing hostile stored

    def logged_websocket_session():
        lines = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
        return any(line.get("path") == "/ws" and line.get("user_id") == user.user_id for line in lines)

    wait_until(logged_websocket_session, message="the WebSocket session's request line")  # logged when it ends


@pytest.mark.not_on_cluster("frames and cursors are parsed the same whatever the Redis")
@pytest.mark.parametrize("position", ["18446744073709551616-0", "1-1\n", "01-1" + "0" * 30])
def test_a_hostile_cursor_is_refused_before_the_websocket_upgrade(server, position):
    user = Api(server.url)
    cursor = base64.urlsafe_b64encode(json.dumps({user.channel: position}).encode()).rstrip(b"=").decode()
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        open_ws(server.url, user.auth, cursor=cursor)
    assert refused.value.status_code == 400


def test_a_users_live_connections_are_capped_across_workers_and_instances(server, start_server):
    first = server
    second = start_server(workers=1, MAX_CONNECTIONS_PER_USER=CAP)
    user, neighbour = Api(first.url), Api(first.url)
    cursor = user.current_cursor()
    opened = []
    try:
        opened.append(sse := SSE(first.url, user.auth))
        assert sse.status == 200
        opened.append(ws := open_ws(second.url, user.auth))
        assert ws_json(ws)["type"] == "welcome"
        held = {}
        poller = threading.Thread(target=lambda: held.update(answer=user.wait(cursor, timeout=20)), daemon=True)
        poller.start()
        wait_until(lambda: open_connections(first.url, "long_poll") == 1, message="a held long poll")

        for base in (first.url, second.url):  # the fourth, on any worker of any instance
            opened.append(refused := SSE(base, user.auth))
            assert refused.status == 429 and json.loads(refused.body)["error"]["code"] == "too_many_connections"
            with pytest.raises(websocket.WebSocketBadStatusException) as upgrade:
                open_ws(base, user.auth)
            assert upgrade.value.status_code == 429
            assert user.wait(cursor, timeout=1).status_code == 429
        assert user.poll(cursor).status_code == 204  # polling holds no connection: never capped
        opened.append(other := SSE(first.url, neighbour.auth))
        assert other.status == 200  # another user's cap is their own

        user.publish_ok({"n": 1})  # all three live connections deliver it
        assert sse.next_event()["data"]["data"] == {"n": 1}
        assert ws_json(ws)["data"] == {"n": 1}
        poller.join(10)
        assert held["answer"].status_code == 200  # the long poll answered, and gave its place back

        def one_more_sse():
            opened.append(stream := SSE(second.url, user.auth))
            return stream.status == 200

        wait_until(one_more_sse, message="the freed place taken by a new stream")
        ws.close()  # gone: its place is free again once the server notices
        wait_until(one_more_sse, message="the closed WebSocket's place taken")
    finally:
        for connection in opened:
            connection.close()
