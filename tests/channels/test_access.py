"""Who may subscribe and publish: current_access, check_subscribe and check_publish against real Redis."""

from __future__ import annotations

import pytest

from app.apikeys.store import ApiKey
from app.channels.access import Access, check_publish, check_subscribe, current_access
from app.errors import ApiError

ALICE, BOB, ADMIN = "a" * 32, "b" * 32, "c" * 32


@pytest.fixture
def rooms(app, rdb, namespace, new_user):
    """chat (members, server), game (authenticated, subscribers), club (members, subscribers); two users."""
    alice, bob = new_user(), new_user()
    return {
        "client": app.extensions["redis"],
        "alice": alice["id"],
        "bob": bob["id"],
        "chat": namespace("chat"),
        "game": namespace("game", subscribe="authenticated", publish="subscribers"),
        "club": namespace("club", publish="subscribers", presence=True),
    }


def refused(call, status: int, code: str) -> None:
    with pytest.raises(ApiError) as caught:
        call()
    assert (caught.value.status, caught.value.code) == (status, code)


def test_members_namespaces_need_a_grant_in_force_and_admins_none(rooms, granted, clock):
    client, alice, bob = rooms["client"], rooms["alice"], rooms["bob"]
    granted("chat:1", alice, expires_in=60)
    granted("chat:2", bob)
    channels = ["chat:1", "chat:2", "chat:3"]
    seen = current_access(client, alice, False, channels)
    assert seen["chat:1"].allowed and seen["chat:1"].namespace == rooms["chat"]
    assert 0 < seen["chat:1"].expires_at - clock.time() <= 60
    assert seen["chat:2"] == Access(False, "revoked", None, rooms["chat"])
    assert seen["chat:3"] == Access(False, "revoked", None, rooms["chat"])
    assert current_access(client, bob, False, ["chat:2"])["chat:2"] == Access(True, None, None, rooms["chat"])
    assert all(
        a == Access(True, None, None, rooms["chat"]) for a in current_access(client, ADMIN, True, channels).values()
    )

    clock.ahead = 61
    assert current_access(client, alice, False, ["chat:1"])["chat:1"] == Access(False, "expired", None, rooms["chat"])


def test_authenticated_namespaces_admit_every_user(rooms):
    seen = current_access(rooms["client"], rooms["alice"], False, ["game:lobby", "game:x"])
    assert seen == {c: Access(True, None, None, rooms["game"]) for c in ("game:lobby", "game:x")}


def test_a_namespace_that_is_gone_admits_nobody(rooms, granted):
    granted("chat:1", rooms["alice"])
    rooms["client"].hdel("namespaces", "chat")
    for user_id, is_admin in ((rooms["alice"], False), (ADMIN, True)):
        assert current_access(rooms["client"], user_id, is_admin, ["chat:1"])["chat:1"] == Access(
            False, "namespace_deleted"
        )
    assert current_access(rooms["client"], ADMIN, True, ["webhooks:x", "nope:x"]) == {
        "webhooks:x": Access(False, "namespace_deleted"),
        "nope:x": Access(False, "namespace_deleted"),
    }


def test_section_4_channels_keep_their_rules(rooms):
    client, alice = rooms["client"], rooms["alice"]
    own, other = f"user:{alice}", f"user:{BOB}"
    seen = current_access(client, alice, False, [own, other, "broadcast", "webhooks"])
    assert seen == {
        own: Access(True),
        other: Access(False, "access_changed"),
        "broadcast": Access(True),
        "webhooks": Access(False, "access_changed"),
    }
    assert all(a.allowed for a in current_access(client, ADMIN, True, [own, other, "broadcast", "webhooks"]).values())


def test_check_subscribe_answers_400_then_404_then_403(rooms, granted):
    client, alice = rooms["client"], rooms["alice"]
    granted("chat:1", alice)
    assert check_subscribe(client, alice, False, ["chat:1", "game:x", f"user:{alice}"])["chat:1"].allowed
    refused(lambda: check_subscribe(client, alice, False, ["chat:2", "nope:x", "bad name"]), 400, "bad_request")
    for malformed in ("chat:", "Chat:x", "x" * 33 + ":y", "orders", "chat:a:b", "user:"):
        refused(lambda m=malformed: check_subscribe(client, alice, False, [m]), 400, "bad_request")
    refused(lambda: check_subscribe(client, alice, False, ["chat:2", "nope:x"]), 404, "not_found")
    refused(lambda: check_subscribe(client, ADMIN, True, ["broadcast:x"]), 404, "not_found")
    refused(lambda: check_subscribe(client, alice, False, ["chat:1", "chat:2"]), 403, "forbidden")
    refused(lambda: check_subscribe(client, alice, False, [f"user:{BOB}"]), 403, "forbidden")
    assert check_subscribe(client, ADMIN, True, ["chat:2", f"user:{BOB}"])["chat:2"].allowed


def key(*channels: str) -> ApiKey:
    return ApiKey("k", "test", frozenset({"events:publish"}), channels)


def test_check_publish_in_a_server_namespace_admits_admins_and_covering_keys(rooms, granted):
    client, alice = rooms["client"], rooms["alice"]
    granted("chat:1", alice)

    def publish(channel="chat:1", user_id=None, is_admin=False, api_key=None):
        return check_publish(client, channel, user_id=user_id, is_admin=is_admin, api_key=api_key)

    assert publish(user_id=ADMIN, is_admin=True) == rooms["chat"]
    for rule in ("chat:1", "chat:*", "*"):
        assert publish(api_key=key("other:1", rule)) == rooms["chat"]
    refused(lambda: publish(api_key=key("chat:2", "club:*", "user:*")), 403, "forbidden")
    refused(lambda: publish(user_id=alice), 403, "forbidden")  # granted, but only the server publishes here
    refused(lambda: publish("nope:1", user_id=ADMIN, is_admin=True), 404, "not_found")
    refused(lambda: publish("webhooks:1", api_key=key("*")), 404, "not_found")


def test_check_publish_in_a_subscribers_namespace_admits_who_may_subscribe(rooms, granted, clock):
    client, alice, bob = rooms["client"], rooms["alice"], rooms["bob"]
    granted("club:1", alice, expires_in=60)

    def publish(channel, user_id):
        return check_publish(client, channel, user_id=user_id, is_admin=False, api_key=None)

    assert publish("club:1", alice) == rooms["club"]
    refused(lambda: publish("club:1", bob), 403, "forbidden")
    assert publish("game:any", bob) == rooms["game"]  # authenticated: every user
    refused(
        lambda: check_publish(client, "club:1", user_id=None, is_admin=False, api_key=key("chat:*")), 403, "forbidden"
    )
    clock.ahead = 61
    refused(lambda: publish("club:1", alice), 403, "forbidden")


def test_check_publish_keeps_section_4_for_other_channels(rooms):
    client, alice = rooms["client"], rooms["alice"]

    def publish(channel, user_id=None, is_admin=False, api_key=None):
        return check_publish(client, channel, user_id=user_id, is_admin=is_admin, api_key=api_key)

    assert publish(f"user:{alice}", alice) is None
    refused(lambda: publish(f"user:{BOB}", alice), 403, "forbidden")
    refused(lambda: publish("broadcast", alice), 403, "forbidden")
    assert publish("broadcast", ADMIN, True) is None and publish(f"user:{BOB}", ADMIN, True) is None
    assert publish("orders", ADMIN, True) is None
    assert publish(f"user:{BOB}", api_key=key("user:*")) is None
    refused(lambda: publish("broadcast", api_key=key("user:*")), 403, "forbidden")
    assert publish("broadcast", api_key=key("broadcast")) is None
