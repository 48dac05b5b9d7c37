"""Delivery: signed with Standard Webhooks, filtered, retried on the schedule, then failed."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime

import pytest
import requests

from app.redis import Keys
from tests.outgoing.conftest import ON_BOTH, channel, not_on_cluster
from tests.servers import wait_until
from tests.utils import bearer

pytestmark = ON_BOTH


class Early:
    """Scenarios that wait out the retry schedule or a secret's overlap, set going together before the module's
    first test, each on an endpoint and a channel of its own, so that their seconds of waiting overlap. Each
    test goes on from where its scenario got to and makes every assertion itself; an error in a scenario's
    start is raised in its own test."""

    def __init__(self, service):
        self.service = service
        self.started: dict[str, tuple] = {}

    def start(self, scenario, *args) -> None:
        try:
            self.started[scenario.__name__] = (scenario(self.service, *args), None)
        except Exception as error:  # noqa: BLE001 - raised again in the scenario's own test
            self.started[scenario.__name__] = (None, error)

    def __getitem__(self, scenario):
        value, error = self.started[scenario.__name__]
        if error is not None:
            raise error
        return value


@pytest.fixture(scope="module", autouse=True)
def early(service, outgoing_redis) -> Early:
    """The module's slow scenarios, started (those of tests that run against one redis-server only when the
    Redis is one)."""
    scenarios = Early(service)
    scenarios.start(start_manual_retry)
    scenarios.start(start_changed)
    scenarios.start(start_deleted, outgoing_redis.client())
    if outgoing_redis.mode == "standalone":
        for scenario in (start_fails_twice, start_redirected, start_rotated):
            scenarios.start(scenario)
    return scenarios


def test_a_published_event_arrives_signed_with_the_event_as_body(service):
    receiver, api = service.receiver, service.admin
    orders = channel()
    endpoint = api.create_endpoint(receiver.behave(f"/ok/{orders}"), [orders])
    assert endpoint["secret"].startswith("whsec_")
    event_id = api.publish(orders, "order.paid", {"total": 12})
    (received,) = receiver.wait_for(f"/ok/{orders}", 1)
    event = received.verify(endpoint["secret"])
    assert re.fullmatch("[0-9a-f]{32}", event.pop("from"))  # published with the admin's access token
    assert event == {"id": event_id, "channel": orders, "event": "order.paid", "data": {"total": 12}, "ts": event["ts"]}
    assert received.headers["Content-Type"] == "application/json"
    message = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    assert message["id"] == received.headers["webhook-id"] and message["event_id"] == event_id
    assert message["next_attempt_at"] is None
    assert [a["status_code"] for a in message["attempts"]] == [204]
    assert json.loads(received.body)["id"] == event_id


def test_channel_and_event_filters_choose_what_is_sent(service):
    receiver, api = service.receiver, service.admin
    orders, other, user = channel(), channel(), f"user:{channel()}"
    patterned = api.create_endpoint(receiver.behave(f"/filters/{orders}"), [orders], events=["order.*"])
    users = api.create_endpoint(receiver.behave(f"/users/{orders}"), ["user:*"], events=[f"note.{orders}"])
    api.publish(orders, "invoice.sent")  # wrong event name
    api.publish(other, "order.paid")  # wrong channel
    api.publish("broadcast", f"note.{orders}")  # not a user channel
    paid = api.publish(orders, "order.paid")
    shipped = api.publish(orders, "order.item.shipped")  # `*` spans dots too
    noted = api.publish(user, f"note.{orders}")
    # Events are matched in publish order: once the last of them arrived, the others were decided.
    received = receiver.wait_for(f"/filters/{orders}", 2)
    assert sorted(r.verify(patterned["secret"])["id"] for r in received) == sorted([paid, shipped])
    (note,) = receiver.wait_for(f"/users/{orders}", 1)
    assert note.verify(users["secret"])["id"] == noted and note.event["channel"] == user
    assert len(api.messages(patterned["id"])) == 2 and len(api.messages(users["id"])) == 1


def test_a_failing_endpoint_is_retried_on_the_schedule_then_failed(service):
    """Schedule 1,2: attempts at 0, 1 and 3 s, each signed afresh under the same webhook-id; then `failed`."""
    receiver, api = service.receiver, service.admin
    orders = channel()
    endpoint = api.create_endpoint(receiver.behave(f"/down/{orders}", status=500, fail_first=0), [orders])
    event_id = api.publish(orders)
    pending = api.message_with(endpoint["id"], lambda m: len(m["attempts"]) == 1)
    assert pending["status"] == "pending" and pending["next_attempt_at"] is not None
    assert pending["attempts"][0]["status_code"] == 500 and pending["attempts"][0]["error"] == "HTTP 500"
    attempts = receiver.wait_for(f"/down/{orders}", 3)
    assert {a.headers["webhook-id"] for a in attempts} == {pending["id"]}
    assert all(a.verify(endpoint["secret"])["id"] == event_id for a in attempts)
    gaps = [later.at - earlier.at for earlier, later in zip(attempts, attempts[1:], strict=False)]
    assert 1.0 <= gaps[0] < 2.5 and 2.0 <= gaps[1] < 3.5, gaps  # the schedule, with room for a busy machine
    assert int(attempts[2].headers["webhook-timestamp"]) >= int(attempts[0].headers["webhook-timestamp"]) + 2
    failed = api.message_with(endpoint["id"], lambda m: m["status"] == "failed")
    assert [a["status_code"] for a in failed["attempts"]] == [500, 500, 500]
    assert failed["next_attempt_at"] is None
    assert [m["id"] for m in api.messages(endpoint["id"], "failed")] == [failed["id"]]
    assert api.messages(endpoint["id"], "pending") == []


def start_fails_twice(service) -> tuple[str, dict]:
    orders = channel()
    endpoint = service.admin.create_endpoint(
        service.receiver.behave(f"/flaky/{orders}", fail_first=2, fail_status=503), [orders]
    )
    service.admin.publish(orders)
    return orders, endpoint


@not_on_cluster("the retry path is the one test_a_failing_endpoint_is_retried... runs on the cluster")
def test_a_message_that_fails_twice_is_delivered_by_its_third_attempt(service, early):
    receiver, api = service.receiver, service.admin
    orders, endpoint = early[start_fails_twice]
    delivered = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    assert [a["status_code"] for a in delivered["attempts"]] == [503, 503, 204]
    assert len({r.headers["webhook-id"] for r in receiver.at(f"/flaky/{orders}")}) == 1


def start_redirected(service) -> tuple[str, str, dict]:
    orders = channel()
    target = service.receiver.behave(f"/target/{orders}")
    moved = service.receiver.behave(f"/moved/{orders}", status=307, location=target)
    endpoint = service.admin.create_endpoint(moved, [orders])
    service.admin.publish(orders)
    return orders, target, endpoint


@not_on_cluster("the sender's rule, not the store's")
def test_a_redirect_is_a_failure_and_is_not_followed(service, early):
    receiver, api = service.receiver, service.admin
    orders, target, endpoint = early[start_redirected]
    failed = api.message_with(endpoint["id"], lambda m: m["status"] == "failed")
    assert [a["status_code"] for a in failed["attempts"]] == [307, 307, 307]
    assert "redirect" in failed["attempts"][0]["error"]
    assert len(receiver.at(f"/moved/{orders}")) == 3
    assert receiver.at(f"/target/{orders}") == []  # the Location was never visited
    # ... though it takes messages: the path is reachable, so the empty list above means something.
    direct = api.create_endpoint(target, [orders])
    api.publish(orders)
    receiver.wait_for(f"/target/{orders}", 1)[0].verify(direct["secret"])


def start_manual_retry(service) -> tuple[str, dict]:
    orders = channel()
    path = f"/retry/{orders}"
    endpoint = service.admin.create_endpoint(service.receiver.behave(path, status=500), [orders])
    service.admin.publish(orders)
    return path, endpoint


def test_manual_retry_sends_a_failed_message_again_with_its_webhook_id(service, early):
    receiver, api = service.receiver, service.admin
    path, endpoint = early[start_manual_retry]
    failed = api.message_with(endpoint["id"], lambda m: m["status"] == "failed")
    receiver.behave(path, status=200)  # the receiver is fixed
    response = api.call("POST", f"/admin/webhook-endpoints/{endpoint['id']}/messages/{failed['id']}/retry")
    assert response.status_code == 202, response.text
    fourth = receiver.wait_for(path, 4)[3]
    assert fourth.headers["webhook-id"] == failed["id"]
    fourth.verify(endpoint["secret"])
    delivered = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    assert [a["status_code"] for a in delivered["attempts"]] == [500, 500, 500, 200]


def start_changed(service) -> tuple[str, dict, str, requests.Response]:
    """The endpoint's URL changed once its message's retry is scheduled (before it is due)."""
    receiver, api = service.receiver, service.admin
    orders = channel()
    endpoint = api.create_endpoint(receiver.behave(f"/old/{orders}", status=500), [orders])
    api.publish(orders)
    api.message_with(endpoint["id"], lambda m: len(m["attempts"]) == 1)  # its retry is scheduled
    new_url = receiver.behave(f"/new/{orders}")
    changed = api.call("PATCH", f"/admin/webhook-endpoints/{endpoint['id']}", json={"url": new_url})
    return orders, endpoint, new_url, changed


def test_a_change_applies_to_retries_already_scheduled(service, early):
    receiver = service.receiver
    orders, endpoint, new_url, changed = early[start_changed]
    assert changed.status_code == 200 and changed.json()["url"] == new_url
    (moved,) = receiver.wait_for(f"/new/{orders}", 1)
    moved.verify(endpoint["secret"])
    assert len(receiver.at(f"/old/{orders}")) == 1


def start_deleted(service, retries) -> dict:
    """The endpoint deleted once its message's retry is scheduled (before it is due)."""
    receiver, api = service.receiver, service.admin
    orders = channel()
    endpoint = api.create_endpoint(receiver.behave(f"/deleted/{orders}", status=500), [orders])
    api.publish(orders)
    message = api.message_with(endpoint["id"], lambda m: len(m["attempts"]) == 1)
    schedule = Keys.outgoing_retries(endpoint["id"])
    scheduled = retries.zscore(schedule, message["id"]) is not None
    deleted = api.call("DELETE", f"/admin/webhook-endpoints/{endpoint['id']}").status_code
    return {
        "orders": orders, "endpoint": endpoint, "message": message,
        "scheduled": scheduled, "deleted": deleted, "left": retries.exists(schedule),
    }  # fmt: skip


def test_a_deleted_endpoint_gets_nothing_more_not_even_scheduled_retries(service, early):
    receiver, api = service.receiver, service.admin
    started = early[start_deleted]
    orders, endpoint, message = started["orders"], started["endpoint"], started["message"]
    assert started["scheduled"]  # scheduled...
    assert started["deleted"] == 204
    assert not started["left"]  # ...and gone with its endpoint
    # Nothing to await: the retry would have come due by then (and been released within half a second).
    due = datetime.fromisoformat(message["next_attempt_at"]).timestamp()
    wait_until(lambda: time.time() > due + 1.0, timeout=10, interval=0.1, message="the retry's due time")
    # Published after the retry would have been sent: once this arrives, the retry would have too.
    sentinel = api.create_endpoint(receiver.behave(f"/sentinel/{orders}"), [orders])
    api.publish(orders)
    receiver.wait_for(f"/sentinel/{orders}", 1)[0].verify(sentinel["secret"])
    assert len(receiver.at(f"/deleted/{orders}")) == 1
    assert api.call("GET", f"/admin/webhook-endpoints/{endpoint['id']}").status_code == 404


def start_rotated(service) -> tuple[str, str, dict, requests.Response, float]:
    """An endpoint's secret rotated, and an event published at once (within the overlap)."""
    api = service.admin
    orders = channel()
    path = f"/rotated/{orders}"
    endpoint = api.create_endpoint(service.receiver.behave(path), [orders])
    rotated = api.call("POST", f"/admin/webhook-endpoints/{endpoint['id']}/rotate-secret")
    rotated_at = time.monotonic()
    api.publish(orders)
    return orders, path, endpoint, rotated, rotated_at


@not_on_cluster("signing, not the store")
def test_rotated_secrets_both_sign_during_the_overlap_then_only_the_new_one(service, early):
    from standardwebhooks import WebhookVerificationError

    receiver, api = service.receiver, service.admin
    orders, path, endpoint, rotated, rotated_at = early[start_rotated]
    assert rotated.status_code == 200 and rotated.headers["Cache-Control"] == "no-store"
    new_secret = rotated.json()["secret"]
    assert new_secret.startswith("whsec_") and new_secret != endpoint["secret"]
    (during,) = receiver.wait_for(path, 1)
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    during.verify(new_secret)
    during.verify(endpoint["secret"])
    # WEBHOOK_OUT_SECRET_OVERLAP_SECONDS is 3 here: afterwards only the new secret signs.
    time.sleep(max(0.0, 3.2 - (time.monotonic() - rotated_at)))
    api.publish(orders)
    after = receiver.wait_for(path, 2)[1]
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    after.verify(new_secret)
    with pytest.raises(WebhookVerificationError):
        after.verify(endpoint["secret"])


def test_replay_since_a_time_and_after_a_cursor_sends_matching_events_again(service):
    receiver, api = service.receiver, service.admin
    name = f"replayed.{channel()}"
    path = f"/replay/{name}"
    endpoint = api.create_endpoint(receiver.behave(path), ["broadcast"], events=[name])
    present = requests.get(service.web.url + "/events", headers=bearer(api.token), timeout=10)
    cursor = present.headers["Event-Cursor"]
    since = datetime.now(UTC).isoformat()
    first = api.publish("broadcast", name)
    after_first = requests.get(service.web.url + "/events", params={"cursor": cursor}, headers=bearer(api.token))
    cursor = after_first.headers["Event-Cursor"]
    second, third = api.publish("broadcast", name), api.publish("broadcast", name)
    originals = receiver.wait_for(path, 3)
    ids = {r.verify(endpoint["secret"])["id"]: r.headers["webhook-id"] for r in originals}
    assert set(ids) == {first, second, third}

    replay = f"/admin/webhook-endpoints/{endpoint['id']}/replay"
    response = api.call("POST", replay, json={"cursor": cursor})
    assert response.status_code == 202 and response.json() == {"status": "accepted", "messages": 2}
    again = receiver.wait_for(path, 5)[3:]
    assert sorted(r.verify(endpoint["secret"])["id"] for r in again) == sorted([second, third])
    assert all(r.headers["webhook-id"] == ids[r.event["id"]] for r in again)  # receivers can de-duplicate

    response = api.call("POST", replay, json={"since": since})
    assert response.status_code == 202 and response.json()["messages"] == 3
    again = receiver.wait_for(path, 8)[5:]
    assert sorted(r.verify(endpoint["secret"])["id"] for r in again) == sorted([first, second, third])


def test_metrics_count_attempts_and_show_each_endpoints_backlog(service):
    receiver, api = service.receiver, service.admin
    orders = channel()
    endpoint = api.create_endpoint(receiver.behave(f"/metrics/{orders}", hang=True), [orders])
    api.publish(orders)
    receiver.wait_for(f"/metrics/{orders}", 1)  # held: the message stays pending
    text = wait_until(
        lambda: (
            (t := requests.get(service.web.url + "/metrics", timeout=10).text)
            and 'rt_webhook_messages_total{outcome="delivered"}' in t
            and f'rt_webhook_backlog{{endpoint="{endpoint["id"]}"}} 1.0' in t
            and t
        ),
        message="metrics",
    )
    assert 'rt_webhook_attempts_total{result="success"}' in text
    assert 'rt_webhook_messages_total{outcome="created"}' in text
    assert f'rt_webhook_oldest_pending_seconds{{endpoint="{endpoint["id"]}"}}' in text
    assert "rt_webhook_feed_backlog 0.0" in text


@not_on_cluster("a page over store reads other tests make")
def test_the_admin_page_lists_endpoints_and_their_recent_messages(service):
    receiver, api = service.receiver, service.admin
    orders = channel()
    endpoint = api.create_endpoint(receiver.behave(f"/page/{orders}"), [orders], description="Billing")
    api.publish(orders)
    message = api.message_with(endpoint["id"], lambda m: m["status"] == "delivered")
    page = requests.get(service.web.url + "/admin/webhooks", headers=bearer(api.token), timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert endpoint["id"] in page.text and message["id"] in page.text and "Billing" in page.text
    assert endpoint["secret"] not in page.text
    assert requests.get(service.web.url + "/admin/webhooks", timeout=10).status_code == 401
