"""PUT, DELETE and GET /channels/{channel}/members, and GET /channels: grants, their expiry and refusals."""

from __future__ import annotations

import time

import pytest

from app.channels import grants
from app.redis import Keys
from tests.utils import redis_snapshot


def members(client, headers, channel="chat:room-1"):
    answer = client.get(f"/channels/{channel}/members", headers=headers)
    assert answer.status_code == 200, answer.get_json()
    assert answer.headers["Cache-Control"] == "no-store"
    return answer.get_json()["members"]


def test_a_grant_is_listed_replaced_and_revoked(client, admin, new_user, namespace, announced):
    namespace("chat")
    alice, bob = new_user(), new_user()
    path = f"/channels/chat:room-1/members/{alice['id']}"
    assert (
        client.put(path, json={"info": {"name": "Alice", "colour": "é"}}, headers=admin["headers"]).status_code == 204
    )
    assert announced == [("access_changed", "chat:room-1", None, alice["id"])]
    before = time.time()
    granted = client.put(
        f"/channels/chat:room-1/members/{bob['id']}", json={"expires_in": 3600}, headers=admin["headers"]
    )
    assert granted.status_code == 204
    listed = members(client, admin["headers"])
    by_id = sorted([alice["id"], bob["id"]])
    assert [m["user_id"] for m in listed] == by_id
    entry = {m["user_id"]: m for m in listed}
    assert entry[alice["id"]] == {"user_id": alice["id"], "info": {"name": "Alice", "colour": "é"}, "expires_at": None}
    assert entry[bob["id"]]["info"] is None
    expires = entry[bob["id"]]["expires_at"]
    assert expires.endswith("Z") and before + 3600 - 2 <= _epoch(expires) <= time.time() + 3600 + 1

    again = client.put(path, json={"expires_in": 60}, headers=admin["headers"])  # replaces info and expiry
    assert again.status_code == 204
    assert {m["user_id"]: m["info"] for m in members(client, admin["headers"])}[alice["id"]] is None

    assert client.delete(path, headers=admin["headers"]).status_code == 204
    assert announced[-1] == ("revoked", "chat:room-1", None, alice["id"])
    assert [m["user_id"] for m in members(client, admin["headers"])] == [bob["id"]]
    assert client.delete(path, headers=admin["headers"]).status_code == 204  # also without a grant
    assert announced[-1] == ("revoked", "chat:room-1", None, alice["id"])


def _epoch(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def test_a_grant_without_a_body_grants_with_no_info_and_no_expiry(client, admin, user, namespace):
    namespace("chat")
    assert client.put(f"/channels/chat:x/members/{user['id']}", headers=admin["headers"]).status_code == 204
    assert members(client, admin["headers"], "chat:x") == [{"user_id": user["id"], "info": None, "expires_at": None}]


def test_a_channel_name_may_hold_every_character_of_the_contract(client, admin, user, namespace):
    namespace("a_b-9")
    channel = "a_b-9:" + "Az09_.=@-" + "x" * 86  # 95 characters
    assert client.put(f"/channels/{channel}/members/{user['id']}", headers=admin["headers"]).status_code == 204
    assert [m["user_id"] for m in members(client, admin["headers"], channel)] == [user["id"]]
    assert client.get("/channels", headers=user["headers"]).get_json() == {"channels": [channel]}


def test_expired_grants_count_as_none(client, admin, new_user, namespace, granted, clock):
    namespace("chat")
    short, forever = new_user(), new_user()
    granted("chat:room-1", short["id"], expires_in=60)
    granted("chat:room-1", forever["id"])
    assert len(members(client, admin["headers"])) == 2
    assert client.get("/channels", headers=short["headers"]).get_json() == {"channels": ["chat:room-1"]}
    clock.ahead = 61
    assert [m["user_id"] for m in members(client, admin["headers"])] == [forever["id"]]
    assert client.get("/channels", headers=short["headers"]).get_json() == {"channels": []}
    assert client.get("/channels", headers=forever["headers"]).get_json() == {"channels": ["chat:room-1"]}


def test_get_channels_lists_the_callers_grants_in_force(client, admin, new_user, namespace, granted, rdb):
    namespace("chat")
    namespace("game", subscribe="authenticated")
    namespace("gone")
    me, other = new_user(), new_user()
    for channel in ("game:1", "chat:b", "chat:a", "gone:x"):
        granted(channel, me["id"])
    granted("chat:c", other["id"])
    rdb.hdel(Keys.namespaces(), "gone")  # a namespace deleted since: its grants no longer count
    answer = client.get("/channels", headers=me["headers"])
    assert answer.status_code == 200 and answer.headers["Cache-Control"] == "no-store"
    assert answer.get_json() == {"channels": ["chat:a", "chat:b", "game:1"]}
    assert client.get("/channels", headers=admin["headers"]).get_json() == {"channels": []}


def test_get_channels_is_for_users_only(client, key):
    assert client.get("/channels").status_code == 401
    answer = client.get("/channels", headers=key("channels:manage"))
    assert answer.status_code == 403 and answer.get_json()["error"]["code"] == "forbidden"


@pytest.mark.parametrize(
    "channel",
    [
        "nothere:room",
        "user:abc",
        "broadcast",
        "webhooks:x",
        "chat",
        "chat:",
        ":x",
        "Chat:x",
        "chat:a b",
        "chat:" + "x" * 96,
    ],
)
def test_a_channel_of_no_namespace_or_of_the_wrong_shape_is_404(
    client, admin, user, namespace, rdb, announced, channel
):
    namespace("chat")
    before = redis_snapshot(rdb)
    for answer in (
        client.put(f"/channels/{channel}/members/{user['id']}", json={}, headers=admin["headers"]),
        client.delete(f"/channels/{channel}/members/{user['id']}", headers=admin["headers"]),
        client.get(f"/channels/{channel}/members", headers=admin["headers"]),
    ):
        assert answer.status_code == 404, (channel, answer.get_json())
        assert answer.get_json()["error"]["code"] == "not_found"
    assert redis_snapshot(rdb) == before and announced == []


@pytest.mark.parametrize("user_id", ["0" * 32, "not-a-user", "A" * 32])
def test_granting_an_unknown_user_is_404(client, admin, namespace, rdb, announced, user_id):
    namespace("chat")
    before = redis_snapshot(rdb)
    answer = client.put(f"/channels/chat:x/members/{user_id}", json={}, headers=admin["headers"])
    assert answer.status_code == 404 and answer.get_json()["error"]["code"] == "not_found"
    assert redis_snapshot(rdb) == before and announced == []


def test_revoking_a_user_id_of_the_wrong_shape_is_404_and_a_well_formed_one_204(client, admin, namespace):
    namespace("chat")
    assert client.delete("/channels/chat:x/members/nobody", headers=admin["headers"]).status_code == 404
    assert client.delete(f"/channels/chat:x/members/{'0' * 32}", headers=admin["headers"]).status_code == 204


INFO_AT_LIMIT = {"n": "é" * 500, "p": "x" * 9}  # 1,024 bytes as compact UTF-8 JSON (é is two bytes)


@pytest.mark.parametrize(
    "body, status",
    [
        ({"info": "Alice"}, 400),
        ({"info": ["Alice"]}, 400),
        ({"expires_in": "60"}, 400),
        ({"expires_in": True}, 400),
        ({"info": {**INFO_AT_LIMIT, "p": INFO_AT_LIMIT["p"] + "x"}}, 422),  # 1,025 bytes as compact JSON
        ({"expires_in": 0}, 422),
        ({"expires_in": -5}, 422),
        ({"expires_in": 10**12}, 422),
    ],
)
def test_bad_grants_are_refused_and_store_nothing(client, admin, user, namespace, rdb, announced, body, status):
    namespace("chat")
    before = redis_snapshot(rdb)
    answer = client.put(f"/channels/chat:x/members/{user['id']}", json=body, headers=admin["headers"])
    assert answer.status_code == status, answer.get_json()
    assert redis_snapshot(rdb) == before and announced == []


def test_info_of_exactly_1_kib_as_compact_json_is_kept(client, admin, user, namespace):
    namespace("chat")
    assert len(grants.compact(INFO_AT_LIMIT).encode()) == 1024
    path = f"/channels/chat:x/members/{user['id']}"
    assert (
        client.put(path, json={"info": INFO_AT_LIMIT, "expires_in": 0.5}, headers=admin["headers"]).status_code == 204
    )
    assert members(client, admin["headers"], "chat:x")[0]["info"] == INFO_AT_LIMIT


def test_only_admins_and_keys_with_the_scope_manage_members(client, user, key, namespace, rdb):
    namespace("chat")
    path = f"/channels/chat:x/members/{user['id']}"
    assert client.put(path, json={}).status_code == 401
    for headers in (user["headers"], key("events:publish", channels=("*",))):
        assert client.put(path, json={}, headers=headers).status_code == 403
        assert client.delete(path, headers=headers).status_code == 403
        assert client.get("/channels/chat:x/members", headers=headers).status_code == 403
    assert not rdb.exists(Keys.channel_members("chat:x"))
    manager = key("channels:manage")
    assert client.put(path, json={}, headers=manager).status_code == 204
    assert [m["user_id"] for m in members(client, manager, "chat:x")] == [user["id"]]
    assert client.delete(path, headers=manager).status_code == 204
    assert members(client, manager, "chat:x") == []


def test_a_channels_members_share_its_streams_hash_slot_and_a_users_index_its_record():
    from redis.cluster import key_slot

    assert key_slot(Keys.channel_members("chat:x").encode()) == key_slot(Keys.stream("chat:x").encode())
    assert key_slot(Keys.user_grants("u1").encode()) == key_slot(Keys.user("u1").encode())
