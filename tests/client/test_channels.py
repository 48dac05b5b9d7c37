"""The Python client's channels against the live service: namespaces, grants, presence, publishing to a
named channel, and readers that follow named channels and hear when access to one ends."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from auth_rt_client import ApiError, Client, EventReader, Member, Namespace

from app import create_app
from app.clock import utc_millis
from tests.client.collector import Collector
from tests.client.conftest import create_key
from tests.events.clients import Api
from tests.servers import LiveServer, wait_until

pytestmark = pytest.mark.not_on_cluster(
    "the client speaks HTTP; the service's cluster paths are tested in tests/events and tests/channels"
)

TRANSPORTS = ["sse", "long-poll"]


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def spaces(server) -> dict[str, str]:  # noqa: ARG001 - the namespaces live in the server's Redis
    """Namespace names of this module's own: one for members, one open to every user."""
    return {"members": unique("club"), "open": unique("town")}


@pytest.fixture(scope="module")
def manager(server, module_cli, spaces) -> str:
    """An API key that manages channels and publishes to this module's namespaces, which it defines."""
    key = create_key(
        module_cli, "rooms", ["channels:manage", "events:publish"], [f"{spaces['members']}:*", f"{spaces['open']}:*"]
    )
    with Client(server.url, key) as client:
        client.put_namespace(spaces["members"], presence=True, join_leave=True)
        client.put_namespace(
            spaces["open"], subscribe="authenticated", publish="subscribers", presence=True, join_leave=True
        )
    return key


def channel_in(namespace: str) -> str:
    return f"{namespace}:{unique('room-')}"


def reader(server: LiveServer, user: Api, transport: str = "sse", **options) -> EventReader:
    return EventReader(server.url, user.access_token, transport=transport, wait_seconds=2, **options)


def test_namespaces_are_created_listed_replaced_and_deleted(server, manager, keys):
    name = unique("ns")
    with Client(server.url, manager) as client:
        created = client.put_namespace(name, subscribe="authenticated", presence=True)
        assert created == Namespace(name, "authenticated", "server", True, False)
        assert created in client.namespaces()
        replaced = client.put_namespace(name, publish="subscribers", presence=True, join_leave=True)
        assert replaced == Namespace(name, "members", "subscribers", True, True)
        assert [n for n in client.namespaces() if n.name == name] == [replaced]
        client.delete_namespace(name)
        assert name not in [n.name for n in client.namespaces()]

        for bad, rules in (("user", {}), ("Bad Name", {}), (name, {"join_leave": True})):
            with pytest.raises(ApiError) as refused:
                client.put_namespace(bad, **rules)
            assert (refused.value.status, refused.value.code) == (422, "validation_failed")
    with Client(server.url, keys.publisher) as client, pytest.raises(ApiError) as out_of_scope:
        client.namespaces()
    assert (out_of_scope.value.status, out_of_scope.value.code) == (403, "forbidden")


def test_grants_are_made_listed_and_revoked(server, manager, spaces):
    channel = channel_in(spaces["members"])
    ada, bob = Api(server.url), Api(server.url)
    with Client(server.url, manager) as client:
        client.grant(channel, ada.user_id, info={"name": "Ada"}, expires_in=3600)
        client.grant(channel, bob.user_id)
        members = {member.user_id: member for member in client.members(channel)}
        assert set(members) == {ada.user_id, bob.user_id}
        assert members[ada.user_id].info == {"name": "Ada"}
        assert 3500 < (members[ada.user_id].expires - datetime.now(UTC)).total_seconds() <= 3600
        assert members[bob.user_id] == Member(bob.user_id, None, None) and members[bob.user_id].expires is None

        client.revoke(channel, ada.user_id)
        assert [member.user_id for member in client.members(channel)] == [bob.user_id]
        client.revoke(channel, ada.user_id)  # no grant any more: still no error

        with pytest.raises(ApiError) as unknown_user:
            client.grant(channel, uuid.uuid4().hex)
        assert unknown_user.value.status == 404
        with pytest.raises(ApiError) as unknown_namespace:
            client.members(f"{unique('none')}:room")
        assert (unknown_namespace.value.status, unknown_namespace.value.code) == (404, "not_found")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reader_follows_named_channels_and_knows_who_sent_each_event(server, manager, spaces, transport):
    members, open_room = channel_in(spaces["members"]), channel_in(spaces["open"])
    user, other = Api(server.url), Api(server.url)
    with Client(server.url, manager) as client:
        client.grant(members, user.user_id)
    collector = Collector(reader(server, user, transport, channels=[members, open_room]))
    try:
        assert collector.reader.channels == (members, open_room)
        with Client(server.url, manager) as client:
            from_server = client.publish(members, "notice", {"n": 1})
        from_user = other.publish_ok({"text": "hello"}, event="message", channel=open_room)
        own = user.publish_ok("mine")
        wanted, seen = {from_server.id, from_user, own}, set()
        # Three channels, three histories: each keeps its order, not the order among them.
        events = collector.until(lambda event: seen.add(event.id) or wanted <= seen)
        by_id = {event.id: event for event in events if not event.event.startswith("presence.")}
        assert set(by_id) == wanted
        assert (by_id[from_server.id].channel, by_id[from_server.id].sender) == (members, None)
        assert (by_id[from_user].channel, by_id[from_user].sender, by_id[from_user].data) == (
            open_room,
            other.user_id,
            {"text": "hello"},
        )
        assert by_id[own].sender == user.user_id
    finally:
        collector.stop()


def test_publishing_to_a_named_channel_follows_the_keys_channels(server, manager, keys, spaces):
    with Client(server.url, keys.publisher) as client, pytest.raises(ApiError) as not_covered:
        client.publish(channel_in(spaces["members"]), "notice")
    assert (not_covered.value.status, not_covered.value.code) == (403, "forbidden")
    with Client(server.url, manager) as client, pytest.raises(ApiError) as no_namespace:
        client.publish(f"{unique('none')}:room", "notice")
    assert no_namespace.value.status in (403, 404)  # not covered by the key, nor existing


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_channel_refused_at_the_start_raises(server, manager, spaces, transport):
    user = Api(server.url)
    cases = [
        (channel_in(spaces["members"]), 403, "forbidden"),  # no grant
        (f"{unique('none')}:room", 404, "not_found"),
        ("not a channel", 400, "bad_request"),
    ]
    for channel, status, code in cases:
        with pytest.raises(ApiError) as refused:
            next(iter(reader(server, user, transport, channels=[channel])))
        assert (refused.value.status, refused.value.code) == (status, code), channel


@pytest.mark.parametrize(("transport", "reason"), [("sse", "revoked"), ("long-poll", "access_changed")])
def test_a_revoked_channel_is_reported_and_the_rest_goes_on(server, manager, spaces, transport, reason):
    channel = channel_in(spaces["members"])
    user = Api(server.url)
    ended: list[tuple[str, str]] = []
    with Client(server.url, manager) as client:
        client.grant(channel, user.user_id)
        collector = Collector(
            reader(server, user, transport, channels=[channel], on_unsubscribed=lambda *notice: ended.append(notice))
        )
        try:
            first = client.publish(channel, "notice", "before")
            assert first.id in [event.id for event in collector.until(lambda event: event.id == first.id)]
            client.revoke(channel, user.user_id)
            # Long polling learns of it at its next request: the held one answers at once, or on time-out.
            wait_until(lambda: ended, timeout=10, message="the reader to hear of the revocation")
            assert ended == [(channel, reason)] and collector.reader.channels == ()
            client.publish(channel, "notice", "after")  # no longer the user's to read
            own = user.publish_ok("still here")
            later = collector.until(lambda event: event.id == own)
            assert [event.channel for event in later if not event.event.startswith("presence.")] == [user.channel]
            assert collector.error is None
        finally:
            collector.stop()


def test_presence_counts_readers_and_their_joins_and_leaves_reach_the_channel(server, manager, spaces):
    channel = channel_in(spaces["members"])
    watcher, walker = Api(server.url), Api(server.url)
    with Client(server.url, manager) as client:
        client.grant(channel, watcher.user_id, info={"name": "Watcher"})
        client.grant(channel, walker.user_id, info={"name": "Walker"})
        watching = Collector(reader(server, watcher, channels=[channel]))
        try:
            wait_until(lambda: client.presence(channel).user_ids == [watcher.user_id], message="the watcher present")
            walking = Collector(reader(server, walker, channels=[channel]))
            try:
                joined = watching.until(lambda e: e.event == "presence.join" and e.data["user_id"] == walker.user_id)
                assert joined[-1].data == {"user_id": walker.user_id, "info": {"name": "Walker"}}
                assert joined[-1].channel == channel and joined[-1].sender is None
                presence = client.presence(channel)
                assert presence.channel == channel and presence.count == 2
                assert presence.user_ids == sorted([watcher.user_id, walker.user_id])
                assert {(u.user_id, u.connections) for u in presence.users} == {
                    (watcher.user_id, 1),
                    (walker.user_id, 1),
                }
                assert {u.user_id: u.info for u in presence.users}[walker.user_id] == {"name": "Walker"}
            finally:
                walking.stop()
            left = watching.until(lambda e: e.event == "presence.leave")
            assert left[-1].data == {"user_id": walker.user_id, "info": {"name": "Walker"}}
            assert client.presence(channel).user_ids == [watcher.user_id]
        finally:
            watching.stop()
        wait_until(lambda: client.presence(channel).count == 0, message="nobody present once the reader closed")


def test_events_named_like_the_services_notices_are_events_to_the_reader(server, base_env):
    """The reader takes `unsubscribed` and `session_ended` only from the service's own notices (no `id:`
    line): events with those names, as a user could publish before they were reserved, are yielded as events."""
    user = Api(server.url)
    ended: list[tuple[str, str]] = []
    collector = Collector(reader(server, user, on_unsubscribed=lambda *notice: ended.append(notice)))
    try:
        bus = create_app(base_env).extensions["event_bus"]
        spoofs = [("unsubscribed", {"channel": user.channel, "reason": "revoked"}), ("session_ended", {})]
        bus._append([(user.channel, name, json.dumps(data)) for name, data in spoofs], utc_millis(), user.user_id)
        own = user.publish_ok("after the spoofs")
        received = collector.until(lambda event: event.id == own)
        assert [event.event for event in received] == ["unsubscribed", "session_ended", "test"]
        assert ended == [] and collector.error is None
    finally:
        collector.stop()
