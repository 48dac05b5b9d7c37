"""GET /channels/{channel}/presence: managers read any channel; a user one it may read, with presence on."""

from __future__ import annotations

import pytest


class Snapshots:
    """A stand-in keeper: records which channels were asked for and answers an empty snapshot."""

    def __init__(self):
        self.asked: list[str] = []

    def snapshot(self, channel: str, limit: int = 1000) -> dict:
        self.asked.append(channel)
        return {"channel": channel, "count": 0, "users": []}


@pytest.fixture
def snapshots(app, monkeypatch) -> Snapshots:
    fake = Snapshots()
    monkeypatch.setitem(app.extensions, "presence", fake)
    return fake


def presence(client, channel, headers):
    return client.get(f"/channels/{channel}/presence", headers=headers)


def test_managers_read_the_presence_of_any_channel_of_a_namespace(client, admin, key, namespace, snapshots):
    namespace("chat", presence=True)
    namespace("quiet")  # presence off: the snapshot is empty, but a manager still gets it
    for headers in (admin["headers"], key("channels:manage")):
        for channel in ("chat:1", "quiet:1"):
            answer = presence(client, channel, headers)
            assert answer.status_code == 200, answer.get_json()
            assert answer.get_json() == {"channel": channel, "count": 0, "users": []}
    assert snapshots.asked == ["chat:1", "quiet:1"] * 2


def test_a_user_reads_presence_only_where_it_may_subscribe_and_presence_is_kept(
    client, new_user, namespace, granted, snapshots
):
    namespace("chat", presence=True)
    namespace("lobby", subscribe="authenticated", presence=True)
    namespace("quiet", subscribe="authenticated")
    member, outsider = new_user(), new_user()
    granted("chat:1", member["id"])
    assert presence(client, "chat:1", member["headers"]).status_code == 200
    assert presence(client, "lobby:x", outsider["headers"]).status_code == 200
    forbidden = presence(client, "chat:1", outsider["headers"])
    assert forbidden.status_code == 403 and forbidden.get_json()["error"]["code"] == "forbidden"
    hidden = presence(client, "quiet:x", member["headers"])  # presence off: 404 even to who may read it
    assert hidden.status_code == 404 and hidden.get_json()["error"]["code"] == "not_found"
    assert snapshots.asked == ["chat:1", "lobby:x"]


@pytest.mark.parametrize("channel", ["nope:1", "chat", "user:abc", "Chat:1"])
def test_a_channel_of_no_namespace_is_404(client, admin, user, namespace, snapshots, channel):
    namespace("chat", presence=True)
    for headers in (admin["headers"], user["headers"]):
        answer = presence(client, channel, headers)
        assert answer.status_code == 404 and answer.get_json()["error"]["code"] == "not_found"
    assert snapshots.asked == []


def test_keys_without_the_scope_and_strangers_are_refused(client, key, namespace, snapshots):
    namespace("chat", presence=True)
    assert presence(client, "chat:1", {}).status_code == 401
    assert presence(client, "chat:1", key("events:publish", channels=("*",))).status_code == 403
    assert snapshots.asked == []


def test_the_snapshot_shows_who_is_present_with_the_info_of_their_grant(
    app, client, admin, new_user, namespace, granted
):
    keeper = app.extensions["presence"]
    namespace("chat", presence=True)
    alice, bob = new_user(), new_user()
    granted("chat:1", alice["id"], info={"name": "Alice"})
    entries = [keeper.enter("chat:1", alice["id"], False), keeper.enter("chat:1", alice["id"], False)]
    entries.append(keeper.enter("chat:1", bob["id"], False))
    try:
        answer = presence(client, "chat:1", alice["headers"])
        assert answer.status_code == 200 and answer.headers["Cache-Control"] == "no-store"
        expected = sorted(
            [
                {"user_id": alice["id"], "info": {"name": "Alice"}, "connections": 2},
                {"user_id": bob["id"], "info": None, "connections": 1},
            ],
            key=lambda user: user["user_id"],
        )
        assert answer.get_json() == {"channel": "chat:1", "count": 2, "users": expected}
    finally:
        for entry in entries:
            keeper.leave(entry)
        keeper.stop()
    assert presence(client, "chat:1", admin["headers"]).get_json()["count"] == 0
