"""One rule for channel patterns: API keys (where they may publish) and webhook endpoints (what they follow)
accept the same patterns, refuse the same ones with the same message in words, and describe them alike."""

from __future__ import annotations

import uuid

import pytest

from app.apikeys.store import create_key
from app.openapi import build_document
from tests.utils import redis_snapshot

LOCAL = {"WEBHOOK_OUT_ALLOW_PRIVATE": "true", "WEBHOOK_OUT_ALLOW_HTTP": "true"}
HOOK = "http://127.0.0.1:9/hooks"  # never contacted: no delivery process runs here
GOOD = ["orders:*", "user:*", "*", "broadcast", "chat:lobby", "shop:eu.orders=1@x-y", "user:" + "0" * 32]
BAD = ["Orders:*", "orders:a*", "**", "user:**", "*:*", "chat lobby", "", "x" * 129, "caf\u00e9", "a\u0000b"]
RULE_WORDS = "a channel name (1-128 of letters, digits and _ . : = @ -), '<namespace>:*' for every channel"


@pytest.fixture
def app(make_app):
    return make_app(**LOCAL)


def save_key(client, admin_headers, channels: list[str]):
    body = {"name": "backend", "scopes": ["events:publish"], "channels": channels}
    return client.post("/admin/api-keys", json=body, headers=admin_headers)


def save_endpoint(client, admin_headers, channels: list[str]):
    return client.post("/admin/webhook-endpoints", json={"url": HOOK, "channels": channels}, headers=admin_headers)


SAVERS = {"api key": save_key, "webhook endpoint": save_endpoint}


@pytest.mark.parametrize("saver", SAVERS)
def test_both_accept_every_pattern_of_the_rule(client, admin_headers, saver):
    saved = SAVERS[saver](client, admin_headers, GOOD)
    assert saved.status_code == 201, saved.get_json()
    assert sorted(saved.get_json()["channels"]) == sorted(GOOD)


@pytest.mark.parametrize("saver", SAVERS)
def test_both_refuse_the_same_patterns_in_words_naming_the_item_and_store_nothing(client, admin_headers, rdb, saver):
    before = redis_snapshot(rdb)
    for bad in BAD:
        refused = SAVERS[saver](client, admin_headers, ["broadcast", bad])
        assert refused.status_code == 422, (bad, refused.get_json())
        message = refused.get_json()["error"]["message"]
        assert message.startswith("Field 'channels': channel 2"), message  # 1-based, never "channels.1"
        assert RULE_WORDS in message and "pattern '" not in message and "^" not in message, message
        shown = bad.isascii() and bad.isprintable() and len(bad) <= 64
        assert (f"channel 2 ({bad!r}) is not" in message) == shown, message  # a short plain value is quoted
    assert redis_snapshot(rdb) == before


def test_an_endpoint_changed_to_a_namespace_pattern_is_kept_and_a_bad_one_refused_alike(client, admin_headers):
    endpoint = save_endpoint(client, admin_headers, ["orders"]).get_json()
    path = f"/admin/webhook-endpoints/{endpoint['id']}"
    changed = client.patch(path, json={"channels": ["orders:*"]}, headers=admin_headers)
    assert changed.status_code == 200 and changed.get_json()["channels"] == ["orders:*"]
    refused = client.patch(path, json={"channels": ["orders:*", "Orders:*"]}, headers=admin_headers)
    assert refused.status_code == 422
    assert refused.get_json()["error"]["message"].startswith("Field 'channels': channel 2 ('Orders:*') is not")


def test_the_command_line_key_takes_the_same_rule(app):
    with app.app_context():
        _, key = create_key("cli backend", ["events:publish"], ["orders:*", "broadcast"])
        assert key["channels"] == ["broadcast", "orders:*"]
        with pytest.raises(Exception, match=r"Channel 2 \('Orders:\*'\) is not a channel pattern"):
            create_key("cli backend", ["events:publish"], ["broadcast", "Orders:*"])


@pytest.mark.not_on_cluster("the document is built from the views alone")
def test_the_document_describes_one_pattern_for_both(app):
    schemas = build_document(app)["components"]["schemas"]
    items = [schemas[name]["properties"]["channels"] for name in ("KeyRequest", "CreateEndpoint")]
    items = [
        channels.get("items") or next(part["items"] for part in channels["anyOf"] if "items" in part)
        for channels in items
    ]
    assert items[0] == items[1] and items[0]["pattern"].startswith("^(\\*|")


def test_an_endpoint_following_a_namespace_gets_and_replays_its_channels_events(app):
    from app.outgoing.replay import history_channels
    from app.outgoing.store import Endpoint

    namespace = f"orders-{uuid.uuid4().hex[:8]}"
    with app.app_context():
        bus = app.extensions["event_bus"]
        for channel in (f"{namespace}:eu", f"{namespace}x:eu"):
            bus.publish(channel, "order.paid", {"n": 1})
        kept = history_channels(app.extensions["redis"], (f"{namespace}:*",))
    endpoint = Endpoint("ep_" + "0" * 32, HOOK, (f"{namespace}:*",), None, False, "whsec_x", None, 0.0)
    assert endpoint.wants(f"{namespace}:eu", "order.paid")
    assert not endpoint.wants(f"{namespace}x:eu", "order.paid") and not endpoint.wants(namespace, "order.paid")
    assert kept == [f"{namespace}:eu"]
