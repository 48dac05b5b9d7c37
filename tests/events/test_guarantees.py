"""What the bus promises: every event after a cursor exactly once and in order, on every transport,
across reconnects, worker restarts, instances and a Redis restart; isolation; prompt ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
from websocket import WebSocketConnectionClosedException

from tests.events.clients import SSE, Api, open_ws, ws_close_code, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, RedisServer, wait_until
from tests.utils import DEFAULT_PASSWORD

HISTORY = 60  # events kept per channel (about: trimmed in whole nodes): past every test's 50 missed, short of 250


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    """Two workers, as in production, that keep a short history (HISTORY)."""
    env = {**base_env, **FAST, "EVENT_HISTORY_MAXLEN": str(HISTORY)}
    live = LiveServer(env, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def spare(base_env, tmp_path_factory):
    """One worker with a short send queue and time-out, shared until a test stops it; then a new one.

    The tests that use it send it a signal (its worker killed and replaced, or SIGTERM) or fill a socket's
    queue, and none depends on an earlier one's state."""
    started: list[LiveServer] = []

    def running() -> LiveServer:
        if not started or started[-1].process.poll() is not None:
            env = {**base_env, **FAST, "WS_SEND_QUEUE": "20", "WS_SEND_TIMEOUT_SECONDS": "1"}
            log_path = tmp_path_factory.mktemp("logs") / "gunicorn.log"
            started.append(LiveServer(env, workers=1, log_path=log_path))
            started[-1].start()
        return started[-1]

    yield running
    for live in started:
        live.stop()


@pytest.fixture(scope="module")
def on_own_redis(base_env, tmp_path_factory):
    """A persistent redis-server of the module's own and two workers on it that take a thousand connections
    per user: the Redis restart's and the connection count's tests (this one first: it restarts nothing)."""
    redis_server = RedisServer(tmp_path_factory.mktemp("redis"), persistent=True)
    redis_server.start()
    env = {**base_env, **FAST, "REDIS_URL": redis_server.url, "MAX_CONNECTIONS_PER_USER": "1000"}
    live = LiveServer(env, workers=2, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live, redis_server
    live.stop()
    redis_server.stop()


def publish_many(user: Api, count: int, start: int = 0) -> list[str]:
    return [user.publish_ok({"n": n}) for n in range(start, start + count)]


def sse_ids(stream: SSE, count: int, timeout: float = 10) -> list[str]:
    return [frame["data"]["id"] for frame in stream.events(count, timeout)]


def ws_event_frames(ws, count: int) -> list[dict]:
    frames = []
    while len(frames) < count:
        frame = ws_json(ws)
        if frame["type"] == "event":
            frames.append(frame)
    return frames


def assert_nothing_more_by_polling(user: Api, cursor: str) -> None:
    assert user.poll(cursor).status_code == 204


# Resume by cursor on every transport: disconnect, 50 events, reconnect, exactly those 50 in order.


def test_resume_sse_by_last_event_id(server):
    user = Api(server.url)
    stream = SSE(server.url, user.auth)
    first = user.publish_ok({"n": "first"})
    frame = stream.next_event()
    assert frame["data"]["id"] == first
    stream.close()
    missed = publish_many(user, 50)
    resumed = SSE(server.url, {**user.auth, "Last-Event-ID": frame["id"]})
    try:
        frames = resumed.events(50)
        assert [f["data"]["id"] for f in frames] == missed
        assert_nothing_more_by_polling(user, frames[-1]["id"])
    finally:
        resumed.close()


def test_resume_sse_by_cursor_query(server):
    user = Api(server.url)
    cursor = user.current_cursor()
    missed = publish_many(user, 50)
    stream = SSE(server.url, user.auth, cursor=cursor)
    try:
        assert sse_ids(stream, 50) == missed
    finally:
        stream.close()


def test_resume_websocket_by_cursor(server):
    user = Api(server.url)
    ws = open_ws(server.url, user.auth)
    cursor = ws_json(ws)["cursor"]
    ws.close()
    missed = publish_many(user, 50)
    ws = open_ws(server.url, user.auth, cursor=cursor)
    try:
        assert ws_json(ws)["type"] == "welcome"
        frames = ws_event_frames(ws, 50)
        assert [f["id"] for f in frames] == missed
        assert_nothing_more_by_polling(user, frames[-1]["cursor"])
    finally:
        ws.close()


@pytest.mark.parametrize("transport", ["poll", "wait"])
def test_resume_polling_and_long_polling_by_cursor(server, transport):
    user = Api(server.url)
    cursor = user.current_cursor()
    missed = publish_many(user, 50)
    received = []
    while len(received) < 50:
        response = getattr(user, transport)(cursor, limit=7)
        assert response.status_code == 200
        received += [e["id"] for e in response.json()["events"]]
        cursor = response.json()["cursor"]
    assert received == missed
    assert_nothing_more_by_polling(user, cursor)


def test_no_cursor_starts_at_the_present(server):
    user = Api(server.url)
    publish_many(user, 3)  # history exists but a reader without a cursor does not get it
    assert user.poll().status_code == 204
    stream = SSE(server.url, user.auth)
    try:
        stream.next(skip_comments=False)
        newest = user.publish_ok({"n": "new"})
        assert stream.next_event()["data"]["id"] == newest
    finally:
        stream.close()


def test_cursor_older_than_history_gives_reset_first(server):
    live = server
    user = Api(live.url)
    cursor = user.current_cursor()
    publish_many(user, 250)  # far past the kept history
    events = user.poll(cursor, limit=1000).json()["events"]
    assert events[0]["event"] == "reset" and events[0]["channel"] == user.channel
    assert [e["data"]["n"] for e in events[1:]] == list(range(250 - len(events) + 1, 250))
    stream = SSE(live.url, user.auth, cursor=cursor)
    try:
        assert stream.next_event()["event"] == "reset"
    finally:
        stream.close()
    fresh = user.current_cursor()  # a cursor inside the history gets no reset
    user.publish_ok({"n": "after"})
    assert [e["event"] for e in user.poll(fresh).json()["events"]] == ["test"]


# Isolation and broadcast


def test_users_are_isolated_on_every_transport(server):
    alice, bob = Api(server.url), Api(server.url)
    bob_cursor = bob.current_cursor()
    alice_stream, bob_stream = SSE(server.url, alice.auth), SSE(server.url, bob.auth)
    alice_ws, bob_ws = open_ws(server.url, alice.auth), open_ws(server.url, bob.auth)
    try:
        for connection in (alice_stream, bob_stream):
            connection.next(skip_comments=False)
        ws_json(alice_ws), ws_json(bob_ws)
        secret = alice.publish_ok({"private": "alice"})
        marker = bob.publish_ok({"private": "bob"})
        # Alice gets hers (the path delivers) ...
        assert alice_stream.next_event()["data"]["id"] == secret
        assert ws_json(alice_ws)["id"] == secret
        # ... Bob's next event on every transport is his own, never Alice's.
        assert bob_stream.next_event()["data"]["id"] == marker
        assert ws_event_frames(bob_ws, 1)[0]["id"] == marker
        assert [e["id"] for e in bob.poll(bob_cursor).json()["events"]] == [marker]
        assert [e["id"] for e in bob.wait(bob_cursor, timeout=1).json()["events"]] == [marker]
    finally:
        for connection in (alice_stream, bob_stream, alice_ws, bob_ws):
            connection.close()


def test_a_cursor_cannot_widen_access(server):
    alice, bob = Api(server.url), Api(server.url)
    alice.publish_ok({"private": True})
    from app.events.cursor import encode_cursor

    forged = encode_cursor({alice.channel: "0-0", "broadcast": "0-0", bob.channel: "0-0"})
    events = bob.poll(forged).json()["events"] if bob.poll(forged).status_code == 200 else []
    assert all(e["channel"] != alice.channel for e in events)


def test_admin_broadcast_reaches_every_user(server, module_cli):
    admin_email = f"admin-{os.getpid()}-{time.monotonic_ns()}@example.com"
    created = module_cli("users", "create", "--email", admin_email, "--password", DEFAULT_PASSWORD, "--role", "admin")
    assert created.returncode == 0, created.stderr
    admin, alice, bob = Api(server.url, email=admin_email), Api(server.url), Api(server.url)
    streams = [SSE(server.url, u.auth) for u in (alice, bob)]
    try:
        for stream in streams:
            stream.next(skip_comments=False)
        assert alice.publish({"x": 1}, channel="broadcast").status_code == 403
        announcement = admin.publish_ok({"notice": "maintenance"}, event="announce", channel="broadcast")
        for stream in streams:
            frame = stream.next_event()
            assert frame["event"] == "announce" and frame["data"]["id"] == announcement
        assert admin.publish({"to": "alice"}, channel=alice.channel).status_code == 201
    finally:
        for stream in streams:
            stream.close()


# Session end closes live connections within one second


def test_logout_all_closes_sse_and_websocket_within_a_second(server):
    phone = Api(server.url, device="phone")
    laptop = Api(server.url, email=phone.email, device="laptop")
    stream, ws = SSE(server.url, phone.auth), open_ws(server.url, laptop.auth)
    stream.next(skip_comments=False)
    ws_json(ws)
    started = time.monotonic()
    laptop.logout_all()
    ended = stream.next_event(timeout=2)
    assert ended["event"] == "session_ended" and ended["data"] == {"reason": "session_ended"}
    assert ws_close_code(ws, timeout=2) == 1008
    assert time.monotonic() - started < 1.0
    assert stream.closed.wait(2)


def test_ending_one_device_closes_only_its_connections(server):
    phone = Api(server.url, device="phone")
    laptop = Api(server.url, email=phone.email, device="laptop")
    phone_stream, laptop_stream = SSE(server.url, phone.auth), SSE(server.url, laptop.auth)
    phone_ws, laptop_ws = open_ws(server.url, phone.auth), open_ws(server.url, laptop.auth)
    try:
        for connection in (phone_stream, laptop_stream):
            connection.next(skip_comments=False)
        ws_json(phone_ws), ws_json(laptop_ws)
        started = time.monotonic()
        response = laptop.http.delete(f"{server.url}/auth/sessions/{phone.session_id}", headers=laptop.auth)
        assert response.status_code == 204
        assert phone_stream.next_event(timeout=2)["event"] == "session_ended"
        assert ws_close_code(phone_ws, timeout=2) == 1008
        assert time.monotonic() - started < 1.0
        still = laptop.publish_ok({"still": "here"})
        assert laptop_stream.next_event()["data"]["id"] == still
        assert ws_event_frames(laptop_ws, 1)[0]["id"] == still
    finally:
        for connection in (phone_stream, laptop_stream, phone_ws, laptop_ws):
            connection.close()


def test_refresh_token_reuse_and_password_change_close_streams(server):
    user = Api(server.url)
    stream = SSE(server.url, user.auth)
    stream.next(skip_comments=False)
    old_refresh = user.refresh_token
    assert user.http.post(f"{server.url}/auth/refresh", json={"refresh_token": old_refresh}).status_code == 200
    assert user.http.post(f"{server.url}/auth/refresh", json={"refresh_token": old_refresh}).status_code == 401
    assert stream.next_event(timeout=2)["event"] == "session_ended"

    other = Api(server.url, email=user.email, device="other")
    user.login()
    stream = SSE(server.url, other.auth)
    stream.next(skip_comments=False)
    body = {"current_password": DEFAULT_PASSWORD, "new_password": DEFAULT_PASSWORD + "!"}
    assert user.http.post(f"{server.url}/auth/password", json=body, headers=user.auth).status_code == 204
    assert stream.next_event(timeout=2)["event"] == "session_ended"


@pytest.mark.not_on_cluster("the worker ends a stream when its token expires: no Redis step")
def test_access_token_expiry_ends_streams(start_server):
    live = start_server(ACCESS_TOKEN_TTL_SECONDS="2")
    user = Api(live.url)
    stream, ws = SSE(live.url, user.auth), open_ws(live.url, user.auth)
    ws_json(ws)
    ended = stream.next_event(timeout=5)
    assert ended["event"] == "session_ended" and ended["data"] == {"reason": "token_expired"}
    assert ws_close_code(ws, timeout=5) == 1008


# Slow consumers, shutdown, restarts


@pytest.mark.not_on_cluster("a socket's send queue is the worker's own: no Redis step")
def test_websocket_that_never_reads_is_closed_1013_while_others_keep_receiving(spare):
    live = spare()
    slow, fast = Api(live.url), Api(live.url)
    slow_ws = open_ws(live.url, slow.auth, sockopt=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)])
    fast_ws = open_ws(live.url, fast.auth)
    ws_json(slow_ws), ws_json(fast_ws)
    blob = "x" * 60_000
    for n in range(150):  # about 9 MB for a client that reads nothing: past every buffer on the way
        slow.publish_ok({"n": n, "blob": blob})
    for n in range(5):
        published_at = time.monotonic()
        event_id = fast.publish_ok({"n": n})
        assert ws_json(fast_ws)["id"] == event_id
        assert time.monotonic() - published_at < 0.2
    # The server closes the connection that fell behind: with 1013 when the close frame fits behind what the
    # client's buffers still hold, or, once its grace has passed with every buffer full, by hanging up after
    # that data (a client that reads nothing cannot be told more). Either way the connection ends.
    codes = []
    slow_ws.settimeout(10)  # a server that kept the connection would time this out
    while not codes:
        try:
            opcode, data = slow_ws.recv_data(control_frame=True)
        except WebSocketConnectionClosedException:
            break
        if opcode == 8:
            codes.append(int.from_bytes(data[:2], "big"))
    assert codes in ([1013], [])
    fast_ws.close()


def test_resume_after_a_worker_is_killed_and_across_instances(spare, server):
    a, b = spare(), server  # b: the module's server, on the same Redis
    user = Api(a.url)
    stream = SSE(a.url, user.auth)
    stream.next(skip_comments=False)
    user.base = b.url
    through_b = user.publish_ok({"via": "b"})  # published through instance B, streamed from A
    frame = stream.next_event()
    assert frame["data"]["id"] == through_b

    for pid in a.worker_pids():
        os.kill(pid, signal.SIGKILL)  # the arbiter starts a new worker
    assert stream.closed.wait(5)
    missed = publish_many(user, 20)
    wait_until(lambda: SSE(a.url, user.auth).status == 200, message="replacement worker")
    resumed = SSE(a.url, {**user.auth, "Last-Event-ID": frame["id"]})
    other_instance = SSE(b.url, {**user.auth, "Last-Event-ID": frame["id"]})
    try:
        assert sse_ids(resumed, 20) == missed
        assert sse_ids(other_instance, 20) == missed
    finally:
        resumed.close()
        other_instance.close()


@pytest.mark.not_on_cluster("the worker's own shutdown; resuming by cursor runs on the cluster above")
def test_sigterm_ends_streams_promptly_and_clients_resume_elsewhere(spare, server):
    first = spare()  # stopped here: a later test gets a new one
    user = Api(first.url)
    stream, ws = SSE(first.url, user.auth), open_ws(first.url, user.auth)
    ws_json(ws)
    seen = user.publish_ok({"n": "before"})
    frame = stream.next_event()
    assert frame["data"]["id"] == seen
    started = time.monotonic()
    first.signal(signal.SIGTERM)
    assert ws_close_code(ws, timeout=5) == 1001
    assert stream.closed.wait(5)
    assert time.monotonic() - started < 3  # not the 10 s graceful_timeout

    user.base = server.url  # another server on the same Redis
    missed = publish_many(user, 10)
    resumed = SSE(server.url, {**user.auth, "Last-Event-ID": frame["id"]})
    try:
        assert sse_ids(resumed, 10) == missed
    finally:
        resumed.close()


@pytest.mark.not_on_cluster("counts the connections of a redis-server of its own")
def test_a_worker_holds_few_redis_connections_however_many_streams(on_own_redis):
    live, redis_server = on_own_redis
    user = Api(live.url)
    streams = [SSE(live.url, user.auth) for _ in range(200)]
    try:
        for stream in streams:
            stream.next(skip_comments=False)
        event_id = user.publish_ok({"to": "all 200"})
        assert all(s.next_event()["data"]["id"] == event_id for s in streams)
        clients = redis_server.client().client_list()
        pubsub = [c for c in clients if "P" in c["flags"]]  # clients in pub/sub mode
        assert len(pubsub) == 2  # one per worker
        assert len(clients) <= 2 * 8  # a small pool per worker, not one per stream
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.not_on_cluster("restarts a redis-server of its own (the cluster's failover: test_failover.py)")
def test_redis_restart_under_a_live_stream_loses_nothing(on_own_redis):
    live, redis_server = on_own_redis
    user = Api(live.url)
    stream = SSE(live.url, user.auth)
    stream.next(skip_comments=False)
    published = [user.publish_ok({"n": 0})]
    last = stream.next_event()
    assert last["data"]["id"] == published[0]

    redis_server.stop()
    assert user.publish({"n": "lost?"}).status_code == 503  # nothing is accepted while Redis is away
    redis_server.start()
    for n in range(1, 11):
        published.append(wait_until(lambda n=n: _publish_or_none(user, {"n": n}), message="publish"))

    received = [last["data"]["id"]]
    while len(received) < len(published):
        try:
            frame = stream.next(timeout=8)
        except TimeoutError:
            break
        if frame.get("event") == "session_ended":
            break
        if "data" in frame:
            received.append(json.loads(frame["data"])["id"])
            last = {"id": frame["id"]}
    if len(received) < len(published):  # the stream ended: resume by cursor, as a client would
        stream.close()
        resumed = SSE(live.url, {**user.auth, "Last-Event-ID": last["id"]})
        received += sse_ids(resumed, len(published) - len(received))
        resumed.close()
    assert received == published


def _publish_or_none(user: Api, data) -> str | None:
    response = user.publish(data)
    return response.json()["id"] if response.status_code == 201 else None
