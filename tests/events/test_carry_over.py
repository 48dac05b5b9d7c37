"""A reload carries open SSE streams over to the new workers: clients stay connected and read every event once.

The tests share one gunicorn (two workers, as in production); each sends it SIGHUP and waits until the old
workers have exited: from then on only the new ones can write to the streams. A reload leaves the server as
it found it, with two new workers.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import tempfile
import threading
import time

import pytest

from app.redis import Keys
from tests.events.clients import SSE, Api, RawSSE, open_connections, parse_block
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until

STREAMS = 6


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """Two workers that log at info (the carry-over's own lines) and give a slow reader a minute to read."""
    env = {**base_env, **FAST, "LOG_LEVEL": "info", "WS_SEND_TIMEOUT_SECONDS": "60"}
    live = LiveServer(env, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


def reload_and_wait(server) -> list[int]:
    """SIGHUP, then wait until every old worker has exited and two new ones serve; the new workers' pids."""
    old = set(server.worker_pids())
    server.signal(signal.SIGHUP)

    def replaced():
        pids = set(server.worker_pids())
        return pids if len(pids) == 2 and not pids & old else None

    return sorted(wait_until(replaced, timeout=30, message="the old workers to exit"))


def raw_http10_stream(base: str, token: str) -> socket.socket:
    """An HTTP/1.0 stream: its body is not chunked, and must still not be after it is carried over."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"GET /events/stream HTTP/1.0\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    return sock


class RawReader:
    """Reads an HTTP/1.0 stream's bytes on a thread."""

    def __init__(self, sock: socket.socket):
        self.sock, self.data, self.closed = sock, b"", threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            while chunk := self.sock.recv(65536):
                self.data += chunk
        except OSError:
            pass
        self.closed.set()

    def event_ids(self) -> list[str]:
        body = self.data.partition(b"\r\n\r\n")[2].decode()
        blocks = [parse_block(block) for block in body.split("\n\n") if block]
        return [json.loads(block["data"])["id"] for block in blocks if "data" in block]


def test_a_reload_carries_streams_over_and_every_event_arrives_once_on_the_same_connection(server, rdb):
    user = Api(server.url)
    streams = [SSE(server.url, user.auth) for _ in range(STREAMS)]
    http10 = RawReader(raw_http10_stream(server.url, user.access_token))
    wait_until(lambda: b": stream open" in http10.data, message="the HTTP/1.0 stream to open")  # else it starts later
    before = user.publish_ok({"n": 0})
    for stream in streams:
        assert stream.next_event()["data"]["id"] == before
    wait_until(lambda: before in http10.event_ids(), message="the HTTP/1.0 stream's first event")
    assert rdb.zcard(Keys.connection_leases(user.user_id)) == STREAMS + 1

    published, stop = [before], threading.Event()

    def publish_throughout():  # events published while the streams are carried over, too
        n = 1
        while not stop.is_set():
            published.append(user.publish_ok({"n": n}))
            n += 1

    publisher = threading.Thread(target=publish_throughout)
    publisher.start()
    try:
        reload_and_wait(server)
    finally:
        stop.set()
        publisher.join()
    published.append(user.publish_ok({"n": "after"}))  # written by a new worker, or by nobody

    for stream in streams:
        ids = [event["data"]["id"] for event in stream.events(len(published) - 1, timeout=20)]
        assert ids == published[1:]
        assert not stream.closed.is_set()
        assert stream.raw.count(": stream open") == 1  # one connection: never reopened
    wait_until(lambda: http10.event_ids() == published, message="every event on the HTTP/1.0 stream")
    assert b"\r\n0\r\n" not in http10.data and not http10.closed.is_set()
    # The leases went with the connections: still one each, given back when they close.
    assert rdb.zcard(Keys.connection_leases(user.user_id)) == STREAMS + 1
    for stream in streams:
        stream.close()
    http10.sock.close()
    wait_until(lambda: rdb.zcard(Keys.connection_leases(user.user_id)) == 0, message="every lease given back")


@pytest.mark.not_on_cluster("the session's end reaches a carried stream as any other: the cluster's way is above")
def test_a_carried_stream_still_ends_when_its_session_does(server):
    user = Api(server.url)
    stream = SSE(server.url, user.auth)
    first = user.publish_ok({"n": 0})
    assert stream.next_event()["data"]["id"] == first
    reload_and_wait(server)
    assert user.publish_ok({"n": 1}) == stream.next_event(timeout=10)["data"]["id"]
    user.logout_all()
    assert stream.next(timeout=10)["event"] == "session_ended"
    assert stream.closed.wait(10)


def alone_from_here(server):
    """Once no stream of an earlier test is open (the one a test opens is then the only one at its reload): the
    server's log from here on, as a function (earlier tests' reloads logged their own carry-over lines)."""
    wait_until(lambda: open_connections(server.url, "sse") == 0, message="no stream of an earlier test")
    logged_before = server.log_path.stat().st_size

    def log() -> str:
        with server.log_path.open("rb") as file:
            file.seek(logged_before)
            return file.read().decode(errors="replace")

    return log


@pytest.mark.not_on_cluster("when a stream is taken is the worker's own affair: the Redis behind it does not enter it")
def test_a_stream_not_at_rest_at_its_turn_is_carried_over_once_its_client_has_read(server):
    """A client that stopped reading has events queued for it in its worker when the reload comes: taken then,
    they would be lost. Its stream is tried again after the others, and carried over once its client has read
    them, on the same connection."""
    log = alone_from_here(server)
    user = Api(server.url)
    slow = RawSSE(server.url, user.auth, receive_buffer=4096)
    blob = "x" * 30_000
    ids = [user.publish_ok({"n": n, "blob": blob}) for n in range(150)]  # 4.5 MB: past the socket buffers
    old = set(server.worker_pids())
    server.signal(signal.SIGHUP)
    wait_until(lambda: "not at rest at their turn" in log(), message="the stream passed over at its turn")
    assert [event["data"]["id"] for event in slow.read_events(150, timeout=30)] == ids
    wait_until(lambda: not set(server.worker_pids()) & old, timeout=30, message="the old workers to exit")
    later = user.publish_ok({"n": 150})  # written by a new worker, or by nobody
    assert slow.read_events(151)[-1]["data"]["id"] == later
    assert not slow.eof and slow.text.count(": stream open") == 1  # one connection: never reopened
    # Its log may come last; on a loaded machine only one new worker may listen by the handover's deadline.
    handed = re.compile(r"carry-over: 1 of 1 streams handed to [12] new workers")
    try:
        wait_until(lambda: handed.search(log()), message="the old worker's line on the handover")
    except TimeoutError:  # say what the workers logged of it (a make test run once missed the line)
        lines = [line for line in log().splitlines() if "carry-over" in line or "exiting" in line.lower()]
        raise AssertionError("no handover line; the carry-over's lines:\n" + "\n".join(lines)) from None
    slow.close()


@pytest.mark.not_on_cluster("when the old worker exits is its own affair: the Redis behind it does not enter it")
def test_a_stopping_worker_waits_for_the_answer_to_its_last_streams_before_it_exits(server, rdb):
    """The last streams sent leave the old worker's handler pool empty before the new worker has adopted them:
    the old worker still reads the answer and says what it carried before it exits. Redis's writes paused over
    the reload hold the adoption (its session check is a script) for a while after the new workers listen, past
    two of the old worker's looks at its pool (one a second)."""
    log = alone_from_here(server)
    user = Api(server.url)
    stream = SSE(server.url, user.auth)
    first = user.publish_ok({"n": 0})
    assert stream.next_event()["data"]["id"] == first
    user.http.close()  # its keep-alive connections would hold the old workers' pools too
    old = set(server.worker_pids())
    rdb.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        server.signal(signal.SIGHUP)
        new = wait_until(
            lambda: len(set(server.worker_pids()) - old) == 2 and set(server.worker_pids()) - old, timeout=30
        )
        for pid in new:
            carry_socket_of(pid)  # listening: the old workers hand their streams on now
        time.sleep(2.5)  # the adoption held this long: the scenario, not a wait for an event
    finally:
        rdb.execute_command("CLIENT", "UNPAUSE")
    adopted = re.compile(r"carry-over: adopted 1 of 1 streams from pid (\d+) in ([\d.]+) s")
    found = wait_until(lambda: adopted.search(log()), timeout=30, message="the stream's adoption")
    assert int(found[1]) in old and float(found[2]) >= 1.5  # past a look of the old worker's at its pool
    wait_until(lambda: not set(server.worker_pids()) & old, timeout=30, message="the old workers to exit")
    assert re.search(r"carry-over: 1 of 1 streams handed to 2 new workers", log()), log()
    assert user.publish_ok({"n": 1}) == stream.next_event(timeout=10)["data"]["id"]
    assert stream.raw.count(": stream open") == 1  # one connection: carried, not reopened
    stream.close()


def carry_socket_of(pid: int) -> str:
    """Where a worker takes streams carried over (it listens once it serves)."""
    pattern = os.path.join(tempfile.gettempdir(), "auth-rt-carry-*", f"*-{pid}.sock")
    return wait_until(lambda: glob.glob(pattern), message="the worker's carry-over socket")[0]


@pytest.mark.not_on_cluster("who may hand a connection over does not depend on Redis")
def test_only_a_worker_of_the_same_server_can_hand_a_connection_over(server):
    user = Api(server.url)
    cursor = user.current_cursor()
    user.publish_ok({"n": "to read"})
    # A forged hand-over: a real session and a cursor with an event after it, as if from an old worker.
    state = {
        "user_id": user.user_id, "role": "user", "session_id": user.session_id, "token_version": 0,
        "expires_at": 2**31, "via": "bearer", "cursor": cursor, "chunked": False, "lease": None,
        "family": socket.AF_UNIX,
    }  # fmt: skip
    ours, theirs = socket.socketpair()
    ours.settimeout(10)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.connect(carry_socket_of(server.worker_pids()[0]))
        socket.send_fds(conn, [json.dumps({"v": 1, "streams": [state]}).encode()], [theirs.fileno()])
        theirs.close()
    assert ours.recv(65536) == b""  # closed unwritten: a worker would have written the event to it
