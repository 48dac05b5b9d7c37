"""An endpoint that has only failed for WEBHOOK_OUT_DISABLE_AFTER_SECONDS is disabled; enabled again, it
receives new events."""

from __future__ import annotations

import pytest

from tests.outgoing.conftest import ON_BOTH, channel
from tests.servers import wait_until

pytestmark = ON_BOTH


@pytest.fixture(scope="module")
def service(make_service):
    return make_service(WEBHOOK_OUT_DISABLE_AFTER_SECONDS="2")


@pytest.fixture(scope="module")
def started(service) -> dict:
    """Both tests' endpoints, each publishing its first event, set going together when the first test starts: their
    seconds of retries overlap. Each test goes on from there on its own endpoint and channel."""
    return {"failing": start_failing(service), "recovering": start_recovering(service)}


def start_failing(service) -> tuple[str, str, dict]:
    orders = channel()
    path = f"/failing/{orders}"
    endpoint = service.admin.create_endpoint(service.receiver.behave(path, status=500), [orders])
    service.admin.publish(orders)
    return orders, path, endpoint


def start_recovering(service) -> tuple[str, dict]:
    orders = channel()
    path = f"/recovering/{orders}"
    # Requests 1 and 2 fail (at 0 and 1 s), 3 succeeds (at 3 s), 4 (the next message's first) fails.
    endpoint = service.admin.create_endpoint(service.receiver.behave(path, fail_on=frozenset({1, 2, 4})), [orders])
    service.admin.publish(orders)
    return orders, endpoint


def test_an_endpoint_failing_for_the_whole_period_is_disabled_and_can_be_enabled_again(service, started):
    receiver, api = service.receiver, service.admin
    orders, path, endpoint = started["failing"]
    # Attempts at 0, 1 and 3 s (schedule 1,2): the third fails 3 s after the first failure, past the 2 s.
    failed = api.message_with(endpoint["id"], lambda m: m["status"] == "failed")
    assert len(failed["attempts"]) == 3
    shown = api.call("GET", f"/admin/webhook-endpoints/{endpoint['id']}").json()
    assert shown["disabled"] is True
    # A disabled endpoint gets no new messages: an enabled one on the same channel shows the event went out.
    sentinel = api.create_endpoint(receiver.behave(f"/sentinel/{orders}"), [orders])
    api.publish(orders)
    receiver.wait_for(f"/sentinel/{orders}", 1)[0].verify(sentinel["secret"])
    assert len(api.messages(endpoint["id"])) == 1 and len(receiver.at(path)) == 3

    receiver.behave(path)  # fixed
    enabled = api.call("PATCH", f"/admin/webhook-endpoints/{endpoint['id']}", json={"disabled": False})
    assert enabled.status_code == 200 and enabled.json()["disabled"] is False
    event_id = api.publish(orders)
    assert receiver.wait_for(path, 4)[3].verify(endpoint["secret"])["id"] == event_id


def test_a_success_ends_the_failing_streak(service, started):
    api = service.admin
    orders, endpoint = started["recovering"]
    first = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    second_event = api.publish(orders)

    def second_failed_once():
        found = [m for m in api.messages(endpoint["id"]) if m["id"] != first["id"]]
        return found and len(found[0]["attempts"]) == 1 and found[0]

    second = wait_until(second_failed_once, message="the second message's first attempt")
    assert second["event_id"] == second_event and second["attempts"][0]["status_code"] == 500
    # Counted from the very first failure, the streak would be over 2 s long by now and disable it.
    assert api.call("GET", f"/admin/webhook-endpoints/{endpoint['id']}").json()["disabled"] is False
