"""The webhook receiver, with deliveries signed by the providers' own libraries, against live gunicorn."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests
import stripe
from standardwebhooks import Webhook

from app.auth.users import create_user
from app.redis import Keys
from app.webhooks.store import DeliveryStore
from tests.events.clients import SSE, Api
from tests.events.conftest import FAST
from tests.servers import LiveServer, wait_until
from tests.utils import DEFAULT_PASSWORD

STANDARD_OLD = "whsec_" + base64.b64encode(b"standard-secret-before-rotation!").decode()
STANDARD_NEW = "whsec_" + base64.b64encode(b"standard-secret-after-rotation!!").decode()
STRIPE_SECRET = "whsec_stripe_test_secret_0123456789"
GITHUB_SECRET = "github-test-secret-0123456789"

WEBHOOK_ENV = {
    "WEBHOOK_PROVIDERS": "acme,stripe,github",
    "WEBHOOK_ACME_SCHEME": "standard",
    "WEBHOOK_ACME_SECRET": f"{STANDARD_OLD} {STANDARD_NEW}",
    "WEBHOOK_ACME_USER_PATH": "data.user_id",
    "WEBHOOK_STRIPE_SCHEME": "stripe",
    "WEBHOOK_STRIPE_SECRET": STRIPE_SECRET,
    "WEBHOOK_STRIPE_USER_PATH": "data.object.metadata.user_id",
    "WEBHOOK_GITHUB_SCHEME": "github",
    "WEBHOOK_GITHUB_SECRET": GITHUB_SECRET,
}


@pytest.fixture(scope="module")
def server(base_env, tmp_path_factory):
    live = LiveServer(
        {**base_env, **FAST, **WEBHOOK_ENV}, workers=2, log_path=tmp_path_factory.mktemp("wh") / "app.log"
    )
    live.start()
    yield live
    live.stop()


@pytest.fixture
def admin(make_app, server) -> Api:
    email = f"admin-{uuid.uuid4().hex[:8]}@example.com"
    with make_app(**WEBHOOK_ENV).app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    return Api(server.url, email=email)


def standard(body: str, secret: str = STANDARD_NEW, msg_id: str | None = None, at: float | None = None) -> dict:
    msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
    moment = datetime.fromtimestamp(time.time() if at is None else at, tz=UTC)
    signature = Webhook(secret).sign(msg_id, moment, body)
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(moment.timestamp())), "webhook-signature": signature}


def stripe_headers(body: str, secret: str = STRIPE_SECRET, at: float | None = None) -> dict:
    timestamp = int(time.time() if at is None else at)
    return {"Stripe-Signature": stripe.WebhookSignature.generate_signature_header(body, secret, timestamp)}


def github_headers(body: str, secret: str = GITHUB_SECRET, event: str = "push", delivery: str | None = None) -> dict:
    # As GitHub documents it: HMAC-SHA256 of the payload, hex, prefixed "sha256=".
    digest = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
    }


def deliver(server, provider: str, body: str, headers: dict) -> requests.Response:
    return requests.post(
        f"{server.url}/webhooks/{provider}", data=body.encode(), headers={"Content-Type": "application/json", **headers}
    )


def webhook_events(admin: Api, cursor: str) -> list[dict]:
    response = admin.poll(cursor)
    return response.json()["events"] if response.status_code == 200 else []


def wait_for_webhook_events(admin: Api, cursor: str, count: int) -> list[dict]:
    return wait_until(lambda: (e := webhook_events(admin, cursor)) and len(e) >= count and e, message="webhook events")


def stripe_body(user_id: str | None = None) -> str:
    event = {
        "id": f"evt_{uuid.uuid4().hex}",
        "type": "payment_intent.succeeded",
        "data": {"object": {"id": "pi_1", "metadata": {"user_id": user_id} if user_id else {}}},
    }
    return json.dumps(event)


def test_each_scheme_is_accepted_and_published(server, admin):
    cursor = admin.current_cursor()
    acme = json.dumps({"type": "invoice.paid", "data": {"amount": 5}})
    assert deliver(server, "acme", acme, standard(acme)).status_code == 202
    assert deliver(server, "acme", acme, standard(acme, secret=STANDARD_OLD)).status_code == 202  # rotation
    body = stripe_body()
    assert deliver(server, "stripe", body, stripe_headers(body)).status_code == 202
    push = json.dumps({"ref": "refs/heads/main"})
    assert deliver(server, "github", push, github_headers(push)).status_code == 202
    events = wait_for_webhook_events(admin, cursor, 4)
    names = sorted(e["event"] for e in events)
    assert names == sorted(
        ["webhook.acme.invoice.paid"] * 2 + ["webhook.stripe.payment_intent.succeeded", "webhook.github.push"]
    )
    assert all(e["channel"] == "webhooks" for e in events)
    github_event = next(e for e in events if e["event"] == "webhook.github.push")
    assert github_event["data"]["payload"] == {"ref": "refs/heads/main"} and github_event["data"]["truncated"] is False


def refusals():
    acme = json.dumps({"type": "invoice.paid"})
    changed = json.dumps({"type": "invoice.paid", "amount": 1_000_000})
    body = stripe_body()
    push = json.dumps({"ref": "x"})
    now = time.time()
    return [
        ("acme", acme, standard(acme, secret="whsec_" + base64.b64encode(b"w" * 32).decode()), "wrong secret"),
        ("acme", changed, standard(acme), "changed body"),
        ("acme", acme, standard(acme, at=now - 400), "stale timestamp"),
        ("acme", acme, standard(acme, at=now + 400), "future timestamp"),
        ("acme", acme, {}, "missing headers"),
        ("acme", acme, {k: v for k, v in standard(acme).items() if k != "webhook-timestamp"}, "no timestamp"),
        ("acme", body, stripe_headers(body), "another provider's scheme"),
        ("stripe", body, stripe_headers(body, secret="whsec_other"), "wrong secret"),
        ("stripe", body.replace("pi_1", "pi_2"), stripe_headers(body), "changed body"),
        ("stripe", body, stripe_headers(body, at=now - 400), "stale timestamp"),
        ("stripe", body, stripe_headers(body, at=now + 400), "future timestamp"),
        ("stripe", body, {}, "missing headers"),
        ("stripe", acme, standard(acme), "another provider's scheme"),
        ("github", push, github_headers(push, secret="nope"), "wrong secret"),
        ("github", push + " ", github_headers(push), "changed body"),
        ("github", push, {}, "missing headers"),
        ("github", push, stripe_headers(push), "another provider's scheme"),
    ]


def test_bad_signatures_are_401_and_nothing_is_recorded_or_published(server, admin, redis_server):
    cursor = admin.current_cursor()
    for provider, body, headers, why in refusals():
        response = deliver(server, provider, body, headers)
        assert response.status_code == 401, (provider, why, response.text)
        assert response.json()["error"]["code"] == "unauthorized"
    assert not list(redis_server.client().scan_iter("webhook:*:delivery:*"))
    # The path does deliver: one good delivery after the refusals is the only event.
    good = json.dumps({"type": "ok"})
    assert deliver(server, "acme", good, standard(good)).status_code == 202
    events = wait_for_webhook_events(admin, cursor, 1)
    time.sleep(0.5)  # any stray publication of a refused delivery would have arrived by now
    assert [e["event"] for e in webhook_events(admin, cursor)] == ["webhook.acme.ok"] == [e["event"] for e in events]


def test_delivery_naming_a_user_reaches_that_users_sse_stream(server):
    user = Api(server.url)
    stream = SSE(server.url, user.auth)
    try:
        stream.next(skip_comments=False)
        body = stripe_body(user.user_id)
        assert deliver(server, "stripe", body, stripe_headers(body)).status_code == 202
        frame = stream.next_event(timeout=5)
        assert frame["event"] == "webhook.stripe.payment_intent.succeeded"
        assert frame["data"]["channel"] == user.channel
        assert frame["data"]["data"]["payload"]["data"]["object"]["metadata"]["user_id"] == user.user_id
    finally:
        stream.close()


def test_duplicates_are_answered_200_and_published_once(server, admin):
    cursor = admin.current_cursor()
    body = json.dumps({"type": "dup.test"})
    headers = standard(body)
    first, again = deliver(server, "acme", body, headers), deliver(server, "acme", body, headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json() == {"id": headers["webhook-id"], "duplicate": True}

    racing = github_headers(json.dumps({"n": 1}), delivery=str(uuid.uuid4()))
    start = threading.Barrier(10)
    answers = []

    def send():
        start.wait()
        answers.append(deliver(server, "github", json.dumps({"n": 1}), racing).status_code)

    threads = [threading.Thread(target=send) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers) == [200] * 9 + [202]
    wait_for_webhook_events(admin, cursor, 2)
    time.sleep(0.5)
    assert sorted(e["event"] for e in webhook_events(admin, cursor)) == ["webhook.acme.dup.test", "webhook.github.push"]


def test_unknown_provider_oversize_and_non_json(server):
    assert deliver(server, "nobody", "{}", {}).status_code == 404
    big = json.dumps({"type": "big", "pad": "x" * (1024 * 1024)})
    oversize = deliver(server, "acme", big, standard(big))
    assert oversize.status_code == 413, oversize.text

    def chunks():  # no Content-Length: the limit must hold while reading
        for _ in range(1100):
            yield b"x" * 1024

    chunked = requests.post(f"{server.url}/webhooks/acme", data=chunks(), headers=standard("x"))
    assert chunked.status_code == 413
    text = "this is not json"
    response = deliver(server, "acme", text, standard(text))
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_request"


def test_large_payloads_are_announced_without_their_body(server, admin):
    cursor = admin.current_cursor()
    body = json.dumps({"type": "large", "pad": "y" * 200_000})
    assert deliver(server, "acme", body, standard(body)).status_code == 202
    event = wait_for_webhook_events(admin, cursor, 1)[0]
    assert event["data"]["truncated"] is True and event["data"]["payload"] is None


def test_admins_list_recent_deliveries_newest_first(server, admin):
    ids = []
    for n in range(3):
        body = json.dumps({"type": f"listed.{n}"})
        headers = standard(body)
        ids.append(headers["webhook-id"])
        assert deliver(server, "acme", body, headers).status_code == 202
    listed = admin.http.get(f"{server.url}/webhooks/acme/deliveries", headers=admin.auth)
    assert listed.status_code == 200
    rows = listed.json()["deliveries"]
    assert [r["id"] for r in rows[:3]] == ids[::-1]
    assert rows[0]["type"] == "listed.2" and rows[0]["received_at"].endswith("Z")
    wait_until(lambda: all(r["status"] == "published" for r in _rows(admin, server)[:3]), message="published")
    user = Api(server.url)
    assert user.http.get(f"{server.url}/webhooks/acme/deliveries", headers=user.auth).status_code == 403


def _rows(admin, server):
    return admin.http.get(f"{server.url}/webhooks/acme/deliveries", headers=admin.auth).json()["deliveries"]


def test_a_recorded_but_unpublished_delivery_is_published_by_the_sweeper(server, admin, make_app):
    """What happens after a failed publish or a worker that died between recording and publishing."""
    cursor = admin.current_cursor()
    app = make_app(**WEBHOOK_ENV)
    store: DeliveryStore = app.extensions["webhook_store"]
    delivery_id = f"orphan-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    assert store.record("acme", delivery_id, "orphaned", {"type": "orphaned"}, None)  # recorded, not published
    events = wait_for_webhook_events(admin, cursor, 1)
    assert [e["event"] for e in events] == ["webhook.acme.orphaned"]
    assert events[0]["data"]["delivery_id"] == delivery_id


def test_a_github_body_replayed_under_a_fresh_delivery_id_is_a_duplicate(server, admin):
    """GitHub signs the body only: whoever captured one could replay it under any X-GitHub-Delivery."""
    cursor = admin.current_cursor()
    body = json.dumps({"ref": "refs/heads/main", "after": uuid.uuid4().hex})
    first = deliver(server, "github", body, github_headers(body))
    assert first.status_code == 202
    replay = deliver(server, "github", body, github_headers(body))  # same body, new delivery id
    assert replay.status_code == 200 and replay.json()["duplicate"] is True
    other = json.dumps({"ref": "refs/heads/main", "after": uuid.uuid4().hex})
    assert deliver(server, "github", other, github_headers(other)).status_code == 202  # a new body is new
    events = wait_for_webhook_events(admin, cursor, 2)  # each published by a greenlet of its own: in either order
    published = sorted(e["data"]["payload"]["after"] for e in events)
    assert published == sorted(json.loads(b)["after"] for b in (body, other))


def test_a_type_with_odd_characters_is_published_under_a_safe_name(server, admin):
    cursor = admin.current_cursor()
    body = json.dumps({"type": "order paid/ünïcode <x>", "data": {}})
    assert deliver(server, "acme", body, standard(body)).status_code == 202
    events = wait_for_webhook_events(admin, cursor, 1)
    assert events[0]["event"] == "webhook.acme.order_paid__n_code__x_"
    assert events[0]["data"]["type"] == "order paid/ünïcode <x>"


def test_control_characters_in_a_delivery_id_or_type_are_refused(server, redis_server):
    before = {k for k in redis_server.client().scan_iter("webhook:*")}
    for event in ({"id": "evt_\u001b[31m", "type": "x"}, {"id": f"evt_{uuid.uuid4().hex}", "type": "a\u0000b"}):
        body = json.dumps(event)
        response = deliver(server, "stripe", body, stripe_headers(body))
        assert response.status_code == 422 and response.json()["error"]["code"] == "validation_failed"
    assert {k for k in redis_server.client().scan_iter("webhook:*")} == before


def test_the_sweeper_retires_a_record_it_cannot_publish_and_goes_on(server, admin, make_app, redis_server):
    cursor = admin.current_cursor()
    app = make_app(**WEBHOOK_ENV)
    store: DeliveryStore = app.extensions["webhook_store"]
    broken, healthy = (f"{name}-{uuid.uuid4().hex[:8]}" for name in ("broken", "healthy"))
    assert store.record("acme", broken, "broken", {"type": "broken"}, None)
    redis_server.client().hset(Keys.webhook_delivery("acme", broken), "payload", "{not json")  # cannot be published
    assert store.record("acme", healthy, "healthy", {"type": "healthy"}, None)
    events = wait_for_webhook_events(admin, cursor, 1)
    assert [e["data"]["delivery_id"] for e in events] == [healthy]
    # The healthy record is marked published after its event is on the bus, so its status is awaited too.
    assert wait_until(
        lambda: (
            {r["id"]: r["status"] for r in _rows(admin, server) if r["id"] in (broken, healthy)}
            == {broken: "failed", healthy: "published"}
        )
    )
