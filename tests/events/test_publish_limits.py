"""What users can push into the service: RATE_LIMIT_PUBLISH on every way to publish, the history's
EVENT_HISTORY_TTL_SECONDS, WS_FRAME_RATE per WebSocket, and the event names only the service sends."""

from __future__ import annotations

import json
import secrets
import time

import pytest
import websocket

from app.apikeys.store import create_key
from app.auth.users import create_user
from app.events.ws import FrameWindow
from app.redis import Keys
from tests.conftest import https_client
from tests.events.clients import Api, open_ws, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email

LIMIT = 5
# The publish limit's window is a minute: nothing a test counts leaves it while the test runs.
LIMITED = {
    "RATE_LIMITS_ENABLED": "true",
    "RATE_LIMIT_PUBLISH": f"{LIMIT}/minute",
    "RATE_LIMIT_REGISTER": "1000/minute",
    "RATE_LIMIT_LOGIN": "1000/minute",
    "EVENT_HISTORY_TTL_SECONDS": "100",
}
RESERVED = [
    "reset",
    "RESET",
    "session_ended",
    "Session_Ended",
    "subscribed",
    "SUBSCRIBED",
    "unsubscribed",
    "UnSubscribed",
    "welcome",
    "Welcome",
    "error",
    "ERROR",
    "ack",
    "Ack",
    "pong",
    "PONG",
    "presence.join",
    "Presence.Join",
    "presence.leave",
    "PRESENCE.LEAVE",
    "presence.anything",
]
NOT_RESERVED = ["resets", "presence", "presence_join", "error.report", "pong.", "welcome-back", "acks"]


@pytest.fixture
def app(make_app):
    return make_app(**LIMITED)


def publish(client, token: str, channel: str, event: str = "note", data=None):
    return client.post("/events", json={"channel": channel, "event": event, "data": data}, headers=bearer(token))


def publish_batch(client, token: str, channel: str, count: int, event: str = "note"):
    events = [{"channel": channel, "event": event, "data": n} for n in range(count)]
    return client.post("/events/batch", json={"events": events}, headers=bearer(token))


def new_user(auth) -> tuple[str, str]:
    """A new user's access token and own channel."""
    tokens = auth.new_user_tokens()
    return tokens["access_token"], f"user:{tokens['user']['id']}"


def new_admin(app, auth) -> str:
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    return auth.login_body(email)["access_token"]


def stored(rdb, channel: str) -> int:
    return rdb.xlen(Keys.stream(channel))


# RATE_LIMIT_PUBLISH


def test_a_user_publishing_past_the_limit_is_refused_with_429_and_retry_after(client, auth, rdb):
    token, channel = new_user(auth)
    answers = [publish(client, token, channel, data=n) for n in range(LIMIT + 1)]
    assert [answer.status_code for answer in answers] == [201] * LIMIT + [429]
    refused = answers[-1]
    assert refused.get_json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert stored(rdb, channel) == LIMIT  # the refused event was not written
    other_token, other_channel = new_user(auth)  # per user: another user is not held back
    assert publish(client, other_token, other_channel).status_code == 201


def test_a_batch_counts_each_event_and_a_refused_batch_counts_nothing(client, auth, rdb):
    token, channel = new_user(auth)
    assert publish_batch(client, token, channel, 3).status_code == 201
    refused = publish_batch(client, token, channel, 3)  # 3 + 3 > 5: all refused
    assert refused.status_code == 429 and refused.get_json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) >= 1
    assert stored(rdb, channel) == 3
    assert publish_batch(client, token, channel, 2).status_code == 201  # the refused three did not count
    assert publish(client, token, channel).status_code == 429
    assert stored(rdb, channel) == LIMIT


def test_publications_refused_for_other_reasons_do_not_count(client, auth, rdb):
    token, channel = new_user(auth)
    for _ in range(LIMIT + 1):
        assert publish(client, token, channel, event="reset").status_code == 422
        assert publish(client, token, "broadcast").status_code == 403
        assert publish(client, token, channel, data="x" * 70_000).status_code == 413
    assert [publish(client, token, channel).status_code for _ in range(LIMIT)] == [201] * LIMIT


def test_admins_and_api_keys_are_not_limited(app, client, auth, rdb):
    admin = new_admin(app, auth)
    assert [publish(client, admin, "broadcast", data=n).status_code for n in range(LIMIT + 3)] == [201] * (LIMIT + 3)
    assert publish_batch(client, admin, "broadcast", LIMIT + 3).status_code == 201
    with app.app_context():
        key, _ = create_key("backend", ["events:publish"], ["*"])
    answers = [publish(client, key, "user:someone", data=n).status_code for n in range(LIMIT + 3)]
    assert answers == [201] * (LIMIT + 3)
    assert publish_batch(client, key, "user:someone", LIMIT + 3).status_code == 201
    assert stored(rdb, "user:someone") == 2 * (LIMIT + 3)


def test_rate_limits_enabled_false_lifts_the_publish_limit(make_app):
    client = https_client(make_app(**{**LIMITED, "RATE_LIMITS_ENABLED": "false", "RATE_LIMIT_PUBLISH": "1/minute"}))
    token, channel = new_user(AuthActions(client))
    assert [publish(client, token, channel).status_code for _ in range(3)] == [201] * 3


# EVENT_HISTORY_TTL_SECONDS


def test_a_channels_history_expires_and_every_publication_renews_it(app, client, auth, rdb, cli):
    token, channel = new_user(auth)
    key = Keys.stream(channel)
    assert publish(client, token, channel).status_code == 201
    assert 90_000 < rdb.pttl(key) <= 100_000
    ways = {
        "a publication": lambda: publish(client, token, channel),
        "a batch": lambda: publish_batch(client, token, channel, 2),
        "the CLI": lambda: cli("events", "publish", "--channel", channel, "--event", "ops.note"),
    }
    for way, publish_again in ways.items():
        rdb.pexpire(key, 5_000)
        publish_again()
        assert 90_000 < rdb.pttl(key) <= 100_000, way


def test_a_history_nobody_publishes_to_is_deleted(make_app, rdb):
    client = https_client(make_app(**{**LIMITED, "EVENT_HISTORY_TTL_SECONDS": "1"}))
    token, channel = new_user(AuthActions(client))
    assert publish(client, token, channel).status_code == 201
    wait_until(lambda: not rdb.exists(Keys.stream(channel)), timeout=10, message="the history expired")


def test_a_cursor_into_an_expired_history_reads_a_reset_once_the_channel_is_used_again(client, auth, rdb):
    token, channel = new_user(auth)
    present = client.get("/events", headers=bearer(token)).headers["Event-Cursor"]
    first = publish(client, token, channel, data=1).get_json()["id"]
    publish(client, token, channel, data=2)  # never read: it expires with the history
    read = client.get("/events", query_string={"cursor": present, "limit": 1}, headers=bearer(token))
    assert [event["id"] for event in read.get_json()["events"]] == [first]
    cursor = read.get_json()["cursor"]
    rdb.delete(Keys.stream(channel))  # what its expiry does

    assert client.get("/events", query_string={"cursor": cursor}, headers=bearer(token)).status_code == 204
    later = publish(client, token, channel, data=3).get_json()["id"]
    answer = client.get("/events", query_string={"cursor": cursor}, headers=bearer(token)).get_json()
    assert [(event["event"], event["channel"]) for event in answer["events"]] == [("reset", channel), ("note", channel)]
    assert answer["events"][1]["id"] == later
    after = client.get("/events", query_string={"cursor": answer["cursor"]}, headers=bearer(token))
    assert after.status_code == 204  # one reset, not one per read


# Reserved event names


def test_reserved_event_names_are_refused_on_every_http_path(app, client, auth, rdb):
    token, channel = new_user(auth)
    admin = new_admin(app, auth)
    with app.app_context():
        key, _ = create_key("backend", ["events:publish"], ["*"])
    for name in RESERVED:
        for caller, where in ((token, channel), (admin, "broadcast"), (key, "user:someone")):
            refused = publish(client, caller, where, event=name)
            assert refused.status_code == 422, (name, refused.get_json())
            assert refused.get_json()["error"]["code"] == "validation_failed"
            assert "reserved" in refused.get_json()["error"]["message"]
        events = [{"channel": "user:someone", "event": "fine"}, {"channel": "user:someone", "event": name}]
        batch = client.post("/events/batch", json={"events": events}, headers=bearer(key))
        assert batch.status_code == 422 and batch.get_json()["error"]["code"] == "validation_failed", name
    assert not rdb.exists(Keys.stream(channel), Keys.stream("broadcast"), Keys.stream("user:someone"))
    for name in NOT_RESERVED:
        assert publish(client, admin, "broadcast", event=name).status_code == 201, name


def test_the_cli_refuses_reserved_event_names(cli, rdb):
    for name in ("reset", "Presence.Leave", "WELCOME"):
        done = cli("events", "publish", "--channel", "broadcast", "--event", name)
        assert done.returncode != 0 and "reserved" in done.stderr, (name, done.stdout, done.stderr)
    assert not rdb.exists(Keys.stream("broadcast"))
    assert cli("events", "publish", "--channel", "broadcast", "--event", "presence").returncode == 0


# On a WebSocket (a live server)

MAX_NAMED = 3
FRAME_RATE = 5


@pytest.fixture(scope="module")
def limited_server(base_env, tmp_path_factory):
    env = {
        **base_env,
        **FAST,
        **LIMITED,
        "WS_FRAME_RATE": str(FRAME_RATE),
        "MAX_CHANNELS_PER_CONNECTION": str(MAX_NAMED),
    }
    live = LiveServer(env, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


@pytest.fixture
def live_admin(limited_server, app) -> Api:
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    return Api(limited_server.url, email=email)


def answers(ws, count: int) -> list[dict]:
    """The next `count` answer frames (event frames skipped)."""
    found = []
    while len(found) < count:
        frame = ws_json(ws, 10)
        if frame["type"] != "event":
            found.append(frame)
    return found


def send_at_once(ws, frames: list[dict]) -> None:
    """Several frames in one write: the server reads them together, well within a second."""
    ws.sock.sendall(
        b"".join(websocket.ABNF.create_frame(json.dumps(f), websocket.ABNF.OPCODE_TEXT).format() for f in frames)
    )


def ping_until_answered(ws, timeout: float = 10) -> None:
    """Ping until a pong comes back (the frame window has moved on)."""
    deadline = time.monotonic() + timeout
    while True:
        ws.send(json.dumps({"type": "ping"}))
        if answers(ws, 1)[0] == {"type": "pong"}:
            return
        assert time.monotonic() < deadline, "no pong"
        time.sleep(0.2)


def test_websocket_publish_frames_count_against_the_publish_limit(limited_server, rdb):
    user = Api(limited_server.url)
    for n in range(LIMIT - 2):
        user.publish_ok(n)
    ws = open_ws(limited_server.url, user.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        replies = []
        for n in range(3):
            ws.send(json.dumps({"type": "publish", "event": "framed", "data": n}))
            replies += answers(ws, 1)
        assert [reply["type"] for reply in replies] == ["ack", "ack", "error"]
        assert replies[-1]["code"] == "rate_limited" and replies[-1]["message"]
        ws.send(json.dumps({"type": "ping"}))
        assert answers(ws, 1) == [{"type": "pong"}]  # the connection stays open
    finally:
        ws.close()
    assert user.publish(0).status_code == 429
    assert stored(rdb, user.channel) == LIMIT


def test_reserved_event_names_are_refused_in_websocket_frames(limited_server, live_admin, rdb):
    ws = open_ws(limited_server.url, live_admin.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        for name in ("reset", "Unsubscribed", "presence.leave", "PONG"):  # fewer than WS_FRAME_RATE
            ws.send(json.dumps({"type": "publish", "channel": "broadcast", "event": name, "data": {}}))
            (reply,) = answers(ws, 1)
            assert reply["type"] == "error" and reply["code"] == "validation_failed", (name, reply)
            assert reply["channel"] == "broadcast"
        ping_until_answered(ws)
    finally:
        ws.close()
    assert not rdb.exists(Keys.stream("broadcast"))


def test_frames_past_ws_frame_rate_are_refused_and_not_acted_on(limited_server, live_admin):
    namespace = f"f{secrets.token_hex(4)}"
    response = live_admin.http.put(
        f"{limited_server.url}/admin/namespaces/{namespace}",
        json={"subscribe": "authenticated", "publish": "subscribers"},
        headers=live_admin.auth,
    )
    assert response.status_code == 200, response.text
    rooms = [f"{namespace}:r{n}" for n in range(6)]
    user = Api(limited_server.url)
    ws = open_ws(limited_server.url, user.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        pings = [{"type": "ping"}] * (FRAME_RATE - 2)
        send_at_once(ws, pings + [{"type": "subscribe", "channel": room} for room in rooms[:4]])
        replies = answers(ws, FRAME_RATE + 2)
        assert replies[: FRAME_RATE - 2] == [{"type": "pong"}] * (FRAME_RATE - 2)
        assert [(r["type"], r["channel"]) for r in replies[FRAME_RATE - 2 : FRAME_RATE]] == [
            ("subscribed", rooms[0]),
            ("subscribed", rooms[1]),
        ]
        assert [(r["type"], r["code"]) for r in replies[FRAME_RATE:]] == [("error", "rate_limited")] * 2
        ping_until_answered(ws)  # still open; the window moved on

        # rooms[2] and rooms[3] were not subscribed: a third named channel fits, a fourth does not.
        ws.send(json.dumps({"type": "subscribe", "channel": rooms[4]}))
        assert answers(ws, 1)[0]["type"] == "subscribed"
        ws.send(json.dumps({"type": "subscribe", "channel": rooms[5]}))
        refused = answers(ws, 1)[0]
        assert (refused["type"], refused["code"]) == ("error", "validation_failed")
    finally:
        ws.close()


def test_publish_frames_past_ws_frame_rate_are_not_published(limited_server, live_admin, rdb):
    ws = open_ws(limited_server.url, live_admin.auth)
    try:
        assert ws_json(ws)["type"] == "welcome"
        frames = [{"type": "publish", "event": "burst", "data": n} for n in range(FRAME_RATE + 3)]
        send_at_once(ws, frames)
        replies = answers(ws, FRAME_RATE + 3)
        assert [r["type"] for r in replies] == ["ack"] * FRAME_RATE + ["error"] * 3
        assert {r["code"] for r in replies[FRAME_RATE:]} == {"rate_limited"}
        ping_until_answered(ws)
    finally:
        ws.close()
    assert stored(rdb, live_admin.channel) == FRAME_RATE


def test_a_frame_window_lets_through_at_most_its_rate_in_any_second():
    window = FrameWindow(3)
    assert [window.admit(t) for t in (10.0, 10.1, 10.2, 10.3, 10.9)] == [True, True, True, False, False]
    assert window.admit(11.0)  # 10.0 has left the window; the two refused frames never counted
    assert not window.admit(11.05)
    assert [window.admit(t) for t in (11.15, 11.19)] == [True, False]  # 10.1 has left; 10.2 not yet
    window.forget_old(12.5)
    assert window.times is None  # nothing kept for an idle (parked) connection
    assert [window.admit(12.5 + n / 100) for n in range(4)] == [True, True, True, False]
