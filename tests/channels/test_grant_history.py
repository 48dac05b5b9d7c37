"""History and grants: a member of a `members` channel reads its events from the start of its grant on. A cursor
before that start, or from an earlier, revoked grant, reads from the grant's start, without a `reset`; granting
again while the grant is in force keeps its start. `authenticated` namespaces and admins read all kept history.

Polling in process (the positions are the follower's, whichever transport reads), then each way a live reader
resumes (SSE's Last-Event-ID, a WebSocket's `?cursor=` and its subscribe frame's cursor) on a real gunicorn.
"""

from __future__ import annotations

import json
import secrets

import pytest

from app.events.cursor import cursor_writer
from app.redis import Keys
from tests.channels.test_subscribe_races import Admin, new_admin, ws_items
from tests.events.clients import SSE, Api, open_ws, ws_json
from tests.events.conftest import FAST
from tests.servers import LiveServer

ROOM = "chat:room"


def at_start(room: str, user_id: str) -> str:
    """A cursor naming the room, and the user's own channels, before anything was said anywhere."""
    channels = [f"user:{user_id}", "broadcast", room]
    return cursor_writer(channels, compact=True)(dict.fromkeys(channels, "0-0"))


@pytest.fixture
def room(app, client, admin, user, namespace):
    """A `members` room, and ways to grant, revoke, say and read in it."""
    namespace("chat")
    bus = app.extensions["event_bus"]

    class Room:
        path = f"/channels/{ROOM}/members/{user['id']}"

        def grant(self, **body) -> None:
            assert client.put(self.path, json=body, headers=admin["headers"]).status_code == 204

        def revoke(self) -> None:
            assert client.delete(self.path, headers=admin["headers"]).status_code == 204

        def say(self, what: str, channel: str = ROOM) -> str:
            return bus.publish(channel, "said", {"what": what}).id

        def read(self, cursor: str, reader: dict = user, channel: str = ROOM) -> list[str]:
            """What a poll from `cursor` reads of the room (a reset shows as "reset")."""
            answer = client.get(
                "/events", query_string={"channels": channel, "cursor": cursor}, headers=reader["headers"]
            )
            assert answer.status_code in (200, 204), answer.get_json()
            events = answer.get_json()["events"] if answer.status_code == 200 else []
            return [
                e["event"] if e["event"] == "reset" else e["data"]["what"] for e in events if e["channel"] == channel
            ]

        def cursor(self, reader: dict = user) -> str:
            """A cursor naming the room at the present."""
            answer = client.get("/events", query_string={"channels": ROOM}, headers=reader["headers"])
            return answer.headers["Event-Cursor"]

    return Room()


def test_a_member_granted_again_reads_from_its_new_grant_not_what_was_said_while_excluded(room, user):
    room.grant()
    cursor = room.cursor()
    room.say("to the first grant")
    assert room.read(cursor) == ["to the first grant"]  # the path reads what it may
    room.revoke()
    room.say("while excluded")
    room.grant()
    room.say("to the second grant")
    assert room.read(cursor) == ["to the second grant"]  # a cursor of the earlier grant: no reset, nothing excluded
    assert room.read(at_start(ROOM, user["id"])) == ["to the second grant"]


def test_granting_again_while_in_force_keeps_the_start(room, user, rdb):
    room.say("before the grant")
    room.grant()
    start = json.loads(rdb.hget(Keys.channel_members(ROOM), user["id"]))["start"]
    room.say("one")
    room.grant(info={"name": "Ann"}, expires_in=3600)  # replaces info and expiry, not the start
    room.say("two")
    assert json.loads(rdb.hget(Keys.channel_members(ROOM), user["id"]))["start"] == start
    assert room.read(at_start(ROOM, user["id"])) == ["one", "two"]


def test_a_grant_that_ran_out_starts_afresh_when_granted_again(room, user, clock):
    room.grant(expires_in=60)
    room.say("while granted")
    clock.ahead = 61
    room.say("after it ran out")
    room.grant()
    room.say("granted again")
    assert room.read(at_start(ROOM, user["id"])) == ["granted again"]


def test_a_cursor_before_the_start_whose_history_was_trimmed_reads_from_the_start_without_a_reset(room, user, rdb):
    room.grant()
    cursor = room.cursor()
    room.say("to the first grant")
    room.revoke()
    excluded = room.say("while excluded")
    rdb.xtrim(Keys.stream(ROOM), minid=excluded, approximate=False)  # the first grant's events are gone
    room.grant()
    room.say("to the second grant")
    assert room.read(cursor) == ["to the second grant"]


def test_authenticated_namespaces_and_admins_read_all_kept_history(room, user, admin, namespace):
    namespace("open", subscribe="authenticated")
    room.say("one", "open:hall")
    room.say("two", "open:hall")
    assert room.read(at_start("open:hall", user["id"]), channel="open:hall") == ["one", "two"]
    room.say("before any grant")
    room.grant()
    assert room.read(at_start(ROOM, admin["id"]), reader=admin) == ["before any grant"]


def test_a_grant_stored_without_a_start_reads_all_kept_history_and_keeps_that_when_granted_again(room, user, rdb):
    room.say("long ago")
    rdb.hset(Keys.channel_members(ROOM), user["id"], json.dumps({"info": None, "expires_at": None}))
    assert room.read(at_start(ROOM, user["id"])) == ["long ago"]
    room.grant(info={"kept": True})
    assert json.loads(rdb.hget(Keys.channel_members(ROOM), user["id"]))["start"] == "0-0"
    assert room.read(at_start(ROOM, user["id"])) == ["long ago"]


# Live readers resuming: SSE's Last-Event-ID, a WebSocket's ?cursor= and its subscribe frame's cursor


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    live = LiveServer({**base_env, **FAST}, workers=1, log_path=tmp_path_factory.mktemp("logs") / "gunicorn.log")
    live.start()
    yield live
    live.stop()


def test_live_readers_resuming_from_an_earlier_grant_read_from_the_new_grants_start(server, app):
    admin: Admin = new_admin(app, server.url)
    name = f"m{secrets.token_hex(4)}"
    admin.put_namespace(name, subscribe="members")
    room = f"{name}:board"
    user = Api(server.url)
    admin.grant(room, user.user_id)
    cursor = user.poll(channels=room).headers["Event-Cursor"]
    admin.publish_ok({}, channel=room, event="first-grant")
    assert admin.http.delete(f"{server.url}/channels/{room}/members/{user.user_id}", headers=admin.auth).ok
    admin.publish_ok({}, channel=room, event="excluded")
    admin.grant(room, user.user_id)
    admin.publish_ok({}, channel=room, event="second-grant")

    stream = SSE(server.url, {**user.auth, "Last-Event-ID": cursor}, params={"channels": room})
    try:
        assert stream.next_event()["event"] == "second-grant"
    finally:
        stream.close()
    ws = open_ws(server.url, user.auth, cursor=cursor, params={"channels": room})
    try:
        assert ws_json(ws)["type"] == "welcome"
        assert ws_json(ws)["event"] == "second-grant"
    finally:
        ws.close()
    ws = open_ws(server.url, user.auth)
    next_item = ws_items(ws)
    try:
        assert next_item()[0] == "welcome"
        ws.send(json.dumps({"type": "subscribe", "channel": room, "cursor": cursor}))
        assert next_item()[0] == "subscribed"
        assert next_item()[0] == "second-grant"
    finally:
        ws.close()
