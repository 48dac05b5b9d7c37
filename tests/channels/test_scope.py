"""The `channels:manage` scope and `<namespace>:*` publish rules of API keys."""

from __future__ import annotations

import pytest

from app.apikeys.store import ApiKey
from tests.utils import bearer, redis_snapshot


def create(client, admin, scopes, channels=()):
    body = {"name": "backend", "scopes": list(scopes), "channels": list(channels)}
    return client.post("/admin/api-keys", json=body, headers=admin["headers"])


def test_a_key_with_channels_manage_needs_no_channels_and_manages_channels(client, admin, user, namespace):
    created = create(client, admin, ["channels:manage"])
    assert created.status_code == 201, created.get_json()
    assert created.get_json()["scopes"] == ["channels:manage"]
    manager = bearer(created.get_json()["key"])
    namespace("chat")
    assert client.put(f"/channels/chat:1/members/{user['id']}", headers=manager).status_code == 204
    publishing = client.post("/events", json={"channel": "chat:1", "event": "x"}, headers=manager)
    assert publishing.status_code == 403  # managing channels is not publishing to them


def test_namespace_rules_publish_to_every_channel_of_the_namespace_only(client, admin, namespace):
    namespace("chat")
    namespace("chatter")
    created = create(client, admin, ["events:publish"], ["chat:*", "news:a=b@c"])
    assert created.status_code == 201, created.get_json()
    assert created.get_json()["channels"] == ["chat:*", "news:a=b@c"]
    key = bearer(created.get_json()["key"])

    def publish(channel):
        return client.post("/events", json={"channel": channel, "event": "said", "data": 1}, headers=key)

    assert publish("chat:room-1").status_code == 201
    assert publish("chatter:room-1").status_code == 403
    assert publish("nope:room-1").status_code == 404


@pytest.mark.parametrize("rule", ["chat:**", "Chat:*", ":*", "*:*", "a" * 33 + ":*", "chat:*x"])
def test_a_rule_that_is_no_channel_namespace_or_star_is_422(client, admin, rdb, rule):
    before = redis_snapshot(rdb)
    answer = create(client, admin, ["events:publish"], [rule])
    assert answer.status_code == 422, (rule, answer.get_json())
    assert redis_snapshot(rdb) == before


def test_may_publish_reads_namespace_rules_by_prefix():
    key = ApiKey("k", "n", frozenset({"events:publish"}), ("chat:*", "user:*", "orders"))
    assert key.may_publish("chat:x") and key.may_publish("user:abc") and key.may_publish("orders")
    assert not any(key.may_publish(c) for c in ("chatter:x", "chat", "broadcast", "orders:x", "game:chat:x"))
    assert ApiKey("k", "n", frozenset(), ("*",)).may_publish("anything:at-all")
