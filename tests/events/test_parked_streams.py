"""SSE streams parked without a greenlet (app/events/handover.py, parked.py), under real gunicorn.

An idle stream leaves gunicorn's handler and is served by the hub, a timer and short-lived greenlets.
These tests read the raw wire on sockets of their own (a small receive buffer, a pause in reading, HTTP/1.0)
to check what a parked stream still owes its client, and that a worker still counts it as a connection.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from tests.events.clients import SSE, Api, RawSSE, open_connections, open_ws, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until

pytestmark = pytest.mark.not_on_cluster(
    "parking is the worker's own socket handling: the Redis behind the hub does not enter it"
)


def module_server(base_env, tmp_path_factory, **env: str):
    """One worker with the delivery tests' quick settings and these, shared by several tests of the module."""
    live = LiveServer({**base_env, **FAST, **env}, workers=1, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    return live


@pytest.fixture(scope="module")
def one_worker(base_env, tmp_path_factory):
    """One worker with a short send queue and time-out, shared by the tests that only look at their own user's
    stream (and their own request IDs in its log), which read each frame as it comes: the slow reader's test
    needs them, and the others never fill a queue. Each leaves no stream open."""
    live = module_server(base_env, tmp_path_factory, WS_SEND_QUEUE="20", WS_SEND_TIMEOUT_SECONDS="1")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def patient(base_env, tmp_path_factory):
    """One worker that lets a slow reader take its time and sends a heartbeat once a minute only."""
    live = module_server(base_env, tmp_path_factory, WS_SEND_TIMEOUT_SECONDS="30", SSE_HEARTBEAT_SECONDS="60")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def crowded(base_env, tmp_path_factory):
    """One worker with room for three connections, shared by the two tests that fill it."""
    live = module_server(base_env, tmp_path_factory, WORKER_CONNECTIONS="3")
    yield live
    live.stop()


def test_a_parked_stream_whose_reader_pauses_gets_every_event_once_in_order(patient):
    live = patient
    user = Api(live.url)
    stream = RawSSE(live.url, user.auth, receive_buffer=4096)
    blob = "x" * 30_000
    ids = [user.publish_ok({"n": n, "blob": blob}) for n in range(150)]  # 4.5 MB: past the socket buffers
    events = stream.read_events(150, timeout=30)
    assert [e["data"]["id"] for e in events] == ids
    assert [e["data"]["data"]["n"] for e in events] == list(range(150))
    late = user.publish_ok({"n": 150})  # parked again after catching up: the hub writes it
    assert stream.read_events(151)[-1]["data"]["id"] == late
    stream.close()


def test_a_parked_stream_that_cannot_take_a_frame_in_time_is_cut_off_while_others_keep_receiving(one_worker):
    live = one_worker
    slow, fast = Api(live.url), Api(live.url)
    stalled = RawSSE(live.url, slow.auth, receive_buffer=4096)
    reader = SSE(live.url, fast.auth)
    blob = "x" * 60_000
    for n in range(150):  # about 9 MB for a client that reads nothing
        slow.publish_ok({"n": n, "blob": blob})
    for n in range(5):
        published_at = time.monotonic()
        event_id = fast.publish_ok({"n": n})
        assert reader.next_event()["data"]["id"] == event_id
        assert time.monotonic() - published_at < 0.5
    stalled.read_to_end(timeout=20)
    assert stalled.eof and not stalled.decoder.ended  # cut off: no end of the response
    assert len(stalled.events()) < 150
    reader.close()


def test_a_parked_http_1_0_stream_is_unframed_and_closes_after_saying_why(one_worker):
    live = one_worker
    user = Api(live.url)
    stream = RawSSE(live.url, user.auth, version="HTTP/1.0")
    assert not stream.chunked
    first = user.publish_ok({"n": 1})
    assert stream.read_events(1)[0]["data"]["id"] == first
    user.logout_all()
    stream.read_to_end()
    assert stream.eof
    last = stream.events()[-1]
    assert last["event"] == "session_ended" and last["data"] == {"reason": "session_ended"}


def test_a_chunked_stream_ends_its_response_with_the_last_chunk(one_worker):
    live = one_worker
    user = Api(live.url)
    stream = RawSSE(live.url, user.auth)
    assert stream.chunked
    user.logout_all()
    stream.read_to_end()  # a stream that was still in its greenlet (a resync came first) ends the same way
    assert stream.decoder.ended
    assert stream.events()[-1]["event"] == "session_ended"


def test_a_parked_stream_ends_as_soon_as_its_client_closes_its_side(patient):
    """A client's FIN. A heartbeat would still be accepted by its socket, so without watching for it the
    stream would live on until a write failed: the heartbeat after next, here 2 minutes away (never, for
    a half-closed client that still reads, as this one)."""
    live = patient
    # The stream of the test before is gone (its client closed its side too): this one is the only one.
    wait_until(lambda: open_connections(live.url, "sse") == 0, message="no stream of an earlier test")
    user = Api(live.url)
    stream = RawSSE(live.url, user.auth)  # parked once it has said ": stream open"
    first = user.publish_ok({"n": 1})
    assert stream.read_events(1)[0]["data"]["id"] == first  # the hub writes to it
    assert open_connections(live.url, "sse") == 1
    stream.sock.shutdown(socket.SHUT_WR)
    stream.read_to_end(timeout=20)
    assert stream.eof and not stream.decoder.ended  # closed without a word: nobody is listening
    wait_until(lambda: open_connections(live.url, "sse") == 0, message="the stream's place given back")
    stream.close()


def test_a_parked_stream_whose_client_sends_something_lives_on(one_worker):
    live = one_worker
    user = Api(live.url)
    stream = RawSSE(live.url, user.auth)
    stream.sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")  # pipelined: it stays unread, unanswered
    ids = [user.publish_ok({"n": n}) for n in range(3)]
    assert [e["data"]["id"] for e in stream.read_events(3)] == ids
    later = user.publish_ok({"n": 3})  # parked again since: still written to
    assert stream.read_events(4)[-1]["data"]["id"] == later
    assert "HTTP/1.1 200" not in stream.text
    stream.close()
    wait_until(lambda: open_connections(live.url, "sse") == 0, message="its leaving noticed by a heartbeat")


def healthz_answers(base: str, timeout: float) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=timeout).status_code == 200
    except requests.exceptions.ReadTimeout:
        return False


def test_parked_streams_still_count_against_worker_connections(crowded):
    streams = 3
    live = crowded
    assert healthz_answers(live.url, timeout=5)  # a free worker answers at once
    users = [Api(live.url) for _ in range(streams)]
    for user in users:
        user.http.close()  # an idle keep-alive connection holds a place too
    open_streams = [RawSSE(live.url, user.auth) for user in users]
    assert not healthz_answers(live.url, timeout=1.5)  # full: the request waits in the listen queue
    open_streams[0].close()  # noticed at the stream's next heartbeat (0.5 s): its place is free
    assert healthz_answers(live.url, timeout=10)
    for stream in open_streams[1:]:
        stream.close()


def test_parked_websockets_still_count_against_worker_connections(crowded):
    sockets = 3
    live = crowded
    # The streams of the test before are noticed gone at their next heartbeat: every place is free again.
    wait_until(lambda: open_connections(live.url, "sse") == 0, message="no stream of an earlier test")
    assert healthz_answers(live.url, timeout=5)
    users = [Api(live.url) for _ in range(sockets)]
    for user in users:
        user.http.close()
    open_sockets = [open_ws(live.url, user.auth) for user in users]
    for ws in open_sockets:
        assert ws_json(ws)["type"] == "welcome"  # then the connection parks
    assert not healthz_answers(live.url, timeout=1.5)
    open_sockets[0].close()  # the watcher sees the client leave: its place is free
    assert healthz_answers(live.url, timeout=10)
    first = users[1]
    first.login()
    event_id = first.publish_ok({"n": 1})  # a parked WebSocket still gets events and answers frames
    assert ws_json(open_sockets[1])["id"] == event_id
    open_sockets[1].send(json.dumps({"type": "ping"}))
    assert ws_json(open_sockets[1]) == {"type": "pong"}
    for ws in open_sockets[1:]:
        ws.close()


def access_line(log_path, request_id: str) -> dict | None:
    """The access line of the request with this X-Request-ID, once written."""
    for line in log_path.read_text().splitlines():
        if request_id in line and '"logger": "access"' in line:
            return json.loads(line)
    return None


def test_a_parked_websockets_access_line_is_written_when_it_ends_with_its_whole_duration(one_worker):
    live = one_worker
    user = Api(live.url)
    ws = open_ws(live.url, {**user.auth, "X-Request-ID": "parked-websocket"})
    assert ws_json(ws)["type"] == "welcome"  # then the connection parks
    opened = time.monotonic()
    event_id = user.publish_ok({"n": 1})
    assert ws_json(ws)["id"] == event_id  # it is parked, and live
    requests.get(f"{live.url}/healthz", headers={"X-Request-ID": "while-parked"}, timeout=5)
    wait_until(lambda: access_line(live.log_path, "while-parked"), message="a later request's access line")
    assert access_line(live.log_path, "parked-websocket") is None  # lines are written; not this one yet
    ws.close()
    closed = time.monotonic()
    line = wait_until(lambda: access_line(live.log_path, "parked-websocket"), message="the websocket's line")
    assert line["path"] == "/ws" and line["user_id"] == user.user_id
    assert line["duration_ms"] >= (closed - opened) * 1000  # from the handshake to the end, not to the park
