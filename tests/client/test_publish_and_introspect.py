"""`Client` against the live service: publishing, batches, introspection and the errors it raises."""

from __future__ import annotations

import pytest
import requests
from auth_rt_client import ApiError, Client, Introspection, PublishedEvent, ServiceUnreachable

from tests.events.clients import Api
from tests.servers import free_port

pytestmark = pytest.mark.not_on_cluster(
    "the client speaks HTTP; the service's cluster paths are tested in tests/events"
)


def read_all(user: Api, cursor: str) -> list[dict]:
    """Every event after `cursor`, read with a plain HTTP poll (independently of the client)."""
    response = user.poll(cursor, limit=1000)
    assert response.status_code in (200, 204), response.text
    return response.json()["events"] if response.status_code == 200 else []


def test_publish_reaches_the_user(server, keys):
    user = Api(server.url)
    cursor = user.current_cursor()
    with Client(server.url, keys.publisher) as client:
        published = client.publish(user.channel, "order.paid", {"total": 42, "items": ["a", "b"]})
    assert isinstance(published, PublishedEvent) and published.channel == user.channel
    [event] = read_all(user, cursor)
    assert (event["id"], event["event"], event["data"]) == (
        published.id,
        "order.paid",
        {"total": 42, "items": ["a", "b"]},
    )


def test_publish_batch_appends_all_in_order(server, keys):
    user, other = Api(server.url), Api(server.url)
    cursors = user.current_cursor(), other.current_cursor()
    batch = [{"channel": user.channel, "event": f"step.{n}", "data": {"n": n}} for n in range(5)]
    batch.append({"channel": other.channel, "event": "ping"})  # data may be left out: null
    with Client(server.url, keys.publisher) as client:
        ids = client.publish_batch(batch)
    assert len(ids) == 6
    assert [(e["id"], e["event"], e["data"]) for e in read_all(user, cursors[0])] == [
        (ids[n], f"step.{n}", {"n": n}) for n in range(5)
    ]
    assert [(e["id"], e["data"]) for e in read_all(other, cursors[1])] == [(ids[5], None)]


@pytest.mark.parametrize(
    ("make_batch", "status", "code"),
    [
        (lambda channel: [{"channel": channel, "event": "x", "data": n} for n in range(101)], 422, "validation_failed"),
        (lambda channel: [], 422, "validation_failed"),
        (
            lambda channel: [{"channel": channel, "event": "ok"}, {"channel": "broadcast", "event": "x"}],
            403,
            "forbidden",
        ),
        (
            lambda channel: [{"channel": channel, "event": "ok"}, {"channel": channel, "event": "bad\u001bname"}],
            422,
            None,
        ),
        (
            lambda channel: [
                {"channel": channel, "event": "ok"},
                {"channel": channel, "event": "big", "data": "x" * 70_000},
            ],
            413,
            "payload_too_large",
        ),
    ],
    ids=["101 events", "none", "a channel outside the key's list", "a bad event name", "oversized data"],
)
def test_a_refused_batch_raises_and_appends_nothing(server, keys, make_batch, status, code):
    user = Api(server.url)
    cursor = user.current_cursor()
    with Client(server.url, keys.publisher) as client, pytest.raises(ApiError) as raised:
        client.publish_batch(make_batch(user.channel))
    assert raised.value.status == status
    if code:
        assert raised.value.code == code
    assert raised.value.message and raised.value.request_id
    assert read_all(user, cursor) == []


def test_errors_carry_the_service_code_and_message(server, keys):
    user = Api(server.url)
    with Client(server.url, "ak_" + "x" * 43) as client, pytest.raises(ApiError) as unknown:
        client.publish(user.channel, "x")
    assert (unknown.value.status, unknown.value.code) == (401, "unauthorized")
    assert str(unknown.value).startswith("401 unauthorized: ")

    with Client(server.url, keys.introspect_only) as client, pytest.raises(ApiError) as out_of_scope:
        client.publish(user.channel, "x")
    assert (out_of_scope.value.status, out_of_scope.value.code) == (403, "forbidden")

    with Client(server.url, keys.publisher) as client, pytest.raises(ApiError) as other_channel:
        client.publish("broadcast", "x")
    assert (other_channel.value.status, other_channel.value.code) == (403, "forbidden")
    assert not other_channel.value.retryable


def test_an_unreachable_service_raises_service_unreachable():
    with Client(f"http://127.0.0.1:{free_port()}", "ak_x", timeout=2) as client, pytest.raises(ServiceUnreachable):
        client.publish("broadcast", "x")


def test_introspection_applies_the_session_and_token_version(server, keys):
    user = Api(server.url)
    with Client(server.url, keys.publisher) as client:
        active = client.introspect(user.access_token)
        assert isinstance(active, Introspection) and active.active
        assert (active.sub, active.sid, active.role) == (user.user_id, user.session_id, "user")
        assert active.token_type == "access_token" and active.exp - active.iat == 900
        assert isinstance(active.ver, int) and active.iss and active.aud

        user.logout_all()  # every token of the user stops working, also for other services
        ended = client.introspect(user.access_token)
        assert not ended.active and ended.raw == {"active": False}
        assert ended.sub is None and ended.sid is None

        for garbage in ("not-a-token", user.refresh_token, "e30.e30.e30"):
            answer = client.introspect(garbage)
            assert answer == Introspection(active=False) and dict(answer.raw) == {"active": False}


def test_introspection_needs_its_scope(server, keys):
    user = Api(server.url)
    with Client(server.url, keys.introspect_only) as client:
        assert client.introspect(user.access_token).active
    assert requests.post(f"{server.url}/auth/introspect", data={"token": user.access_token}).status_code == 401
    with Client(server.url, keys.publish_only) as client, pytest.raises(ApiError) as out_of_scope:
        client.introspect(user.access_token)
    assert (out_of_scope.value.status, out_of_scope.value.code) == (403, "forbidden")
    with Client(server.url, "ak_" + "y" * 43) as client, pytest.raises(ApiError) as unknown:
        client.introspect(user.access_token)
    assert unknown.value.status == 401
