"""The endpoints API in-process: who may call it, what it stores and shows, and bad input (a JSON 4xx that
changes nothing). Nothing here is delivered: no delivery process runs."""

from __future__ import annotations

import base64
import json

import pytest

from app.apikeys.store import create_key
from app.auth.users import create_user
from tests.outgoing.conftest import ON_BOTH
from tests.utils import DEFAULT_PASSWORD, bearer, random_email, redis_snapshot

pytestmark = ON_BOTH

JSON = "application/json"
BASE = "/admin/webhook-endpoints"
LOCAL = {"WEBHOOK_OUT_ALLOW_PRIVATE": "true", "WEBHOOK_OUT_ALLOW_HTTP": "true"}
URL = "http://127.0.0.1:9/hooks"  # never contacted: no delivery process runs in these tests
UNKNOWN_ID = "ep_" + "0" * 32
UNKNOWN_MESSAGE = "msg_" + "a" * 26


@pytest.fixture
def app(make_app):
    return make_app(**LOCAL)


@pytest.fixture
def key(app):
    def make(*scopes: str) -> dict:
        with app.app_context():
            raw, _ = create_key("backend", list(scopes), ["*"] if "events:publish" in scopes else [])
        return bearer(raw)

    return make


@pytest.fixture
def endpoint(client, admin_headers) -> dict:
    body = {"url": URL, "channels": ["orders"], "events": ["order.*"], "description": "Billing"}
    response = client.post(BASE, json=body, headers=admin_headers)
    assert response.status_code == 201, response.get_json()
    return response.get_json()


def outgoing_keys(rdb) -> dict:
    return {k: v for k, v in redis_snapshot(rdb).items() if k.startswith("outgoing:")}


def test_an_endpoint_is_created_shown_changed_and_deleted(client, admin_headers, endpoint, rdb):
    assert set(endpoint) == {"id", "url", "channels", "events", "description", "disabled", "created_at", "secret"}
    assert endpoint["secret"].startswith("whsec_") and len(base64.b64decode(endpoint["secret"][6:])) == 32
    shown = {k: v for k, v in endpoint.items() if k != "secret"}
    assert shown == {**shown, "url": URL, "channels": ["orders"], "events": ["order.*"], "disabled": False}
    assert client.get(f"{BASE}/{endpoint['id']}", headers=admin_headers).get_json() == shown
    listed = client.get(BASE, headers=admin_headers)
    assert listed.get_json() == {"endpoints": [shown]} and listed.headers["Cache-Control"] == "no-store"

    changes = {"channels": ["user:*", "orders"], "events": None, "description": None, "disabled": True}
    changed = client.patch(f"{BASE}/{endpoint['id']}", json=changes, headers=admin_headers)
    assert changed.status_code == 200
    assert changed.get_json() == {**shown, "channels": ["orders", "user:*"], "events": None, "description": None,
                                  "disabled": True}  # fmt: skip
    assert client.patch(f"{BASE}/{endpoint['id']}", json={}, headers=admin_headers).get_json() == changed.get_json()

    assert client.delete(f"{BASE}/{endpoint['id']}", headers=admin_headers).status_code == 204
    assert client.get(f"{BASE}/{endpoint['id']}", headers=admin_headers).status_code == 404
    assert client.delete(f"{BASE}/{endpoint['id']}", headers=admin_headers).status_code == 404
    assert client.get(BASE, headers=admin_headers).get_json() == {"endpoints": []}
    assert outgoing_keys(rdb).keys() <= {"outgoing:endpoints:version"}


def test_the_secret_is_shown_at_creation_and_rotation_only(client, admin_headers, endpoint, rdb):
    creation = client.post(BASE, json={"url": URL, "channels": ["a"]}, headers=admin_headers)
    assert creation.headers["Cache-Control"] == "no-store"
    rotated = client.post(f"{BASE}/{endpoint['id']}/rotate-secret", headers=admin_headers)
    assert rotated.status_code == 200 and rotated.headers["Cache-Control"] == "no-store"
    assert set(rotated.get_json()) == {"secret"} and rotated.get_json()["secret"] != endpoint["secret"]
    for path in (BASE, f"{BASE}/{endpoint['id']}", f"{BASE}/{endpoint['id']}/messages"):
        text = client.get(path, headers=admin_headers).get_data(as_text=True)
        assert endpoint["secret"] not in text and rotated.get_json()["secret"] not in text


def test_api_keys_with_webhooks_manage_may_manage_endpoints_others_may_not(client, auth, key, endpoint):
    manager = key("webhooks:manage")
    created = client.post(BASE, json={"url": URL, "channels": ["orders"]}, headers=manager)
    assert created.status_code == 201
    assert client.get(f"{BASE}/{endpoint['id']}", headers=manager).status_code == 200
    assert client.post(f"{BASE}/{endpoint['id']}/rotate-secret", headers=manager).status_code == 200

    publisher = key("events:publish")
    user = bearer(auth.new_user_tokens()["access_token"])
    for headers, status in ((publisher, 403), (user, 403), ({}, 401), (bearer("ak_" + "x" * 43), 401)):
        assert client.get(BASE, headers=headers).status_code == status
        assert client.post(BASE, json={"url": URL, "channels": ["o"]}, headers=headers).status_code == status
        assert client.delete(f"{BASE}/{endpoint['id']}", headers=headers).status_code == status
        assert client.get(f"{BASE}/{endpoint['id']}/messages", headers=headers).status_code == status
        body = client.get(BASE, headers=headers).get_json()
        assert set(body) == {"error"} and body["error"]["code"] in {"forbidden", "unauthorized"}
    assert client.get(f"{BASE}/{endpoint['id']}", headers=manager).status_code == 200  # still there


def test_a_cross_site_request_with_the_admin_cookie_is_refused(app, auth):
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    assert auth.login(email, transport="cookie").status_code == 200
    body = {"url": URL, "channels": ["orders"]}
    refused = auth.client.post(BASE, json=body, headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "csrf_rejected"
    assert auth.client.post(BASE, json=body, headers={"Origin": "https://localhost"}).status_code == 201


BAD_BODIES = [
    ("{not json", JSON, 400),
    ('["a list"]', JSON, 400),
    ('{"url": "http://127.0.0.1:9/"}', JSON, 400),  # channels missing
    ('{"channels": ["orders"]}', JSON, 400),  # url missing
    ('{"url": 5, "channels": ["orders"]}', JSON, 400),
    ('{"url": "http://127.0.0.1:9/", "channels": "orders"}', JSON, 400),
    ('{"url": "http://127.0.0.1:9/", "channels": [5]}', JSON, 400),
    ('{"url": "http://127.0.0.1:9/", "channels": ["orders"], "events": "order.*"}', JSON, 400),
    ('{"url": "http://127.0.0.1:9/", "channels": ["orders"]}', "text/plain", 415),
    ('{"url": "http://127.0.0.1:9/", "channels": [], "events": ["a"]}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/", "channels": ["no spaces"]}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/", "channels": ["user:**"]}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/", "channels": ["orders"], "events": []}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/", "channels": ["orders"], "events": ["order paid"]}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/", "channels": ["orders"], "description": "a\\u0000b"}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/", "channels": ["orders"], "description": "' + "x" * 501 + '"}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/' + "x" * 2000 + '", "channels": ["orders"]}', JSON, 422),
    ('{"url": "not a url", "channels": ["orders"]}', JSON, 422),
    ('{"url": "ftp://127.0.0.1/", "channels": ["orders"]}', JSON, 422),
    ('{"url": "http://user:pw@127.0.0.1:9/", "channels": ["orders"]}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/#part", "channels": ["orders"]}', JSON, 422),
    ('{"url": "http://127.0.0.1:99999/", "channels": ["orders"]}', JSON, 422),
    ('{"url": "http://127.0.0.1:9/", "channels": ["orders"], "x": NaN}', JSON, 400),
]


def test_bad_bodies_are_a_json_4xx_and_change_nothing(client, admin_headers, endpoint, rdb):
    # One account and endpoint for every case, made once.
    before = outgoing_keys(rdb)
    for data, content_type, status in BAD_BODIES:
        response = client.post(BASE, data=data, content_type=content_type, headers=admin_headers)
        assert response.status_code == status, (data, response.get_json())
        assert set(response.get_json()["error"]) == {"code", "message"}
    assert outgoing_keys(rdb) == before


BAD_CHANGES = [
    ("{not json", 400),
    ('{"url": 5}', 400),
    ('{"channels": "orders"}', 400),
    ('{"channels": []}', 422),
    ('{"events": ["order paid"]}', 422),
    ('{"description": "a\\u001bb"}', 422),
    ('{"url": "ftp://127.0.0.1/"}', 422),
    ('{"disabled": 1}', 400),
]


def test_bad_changes_are_a_json_4xx_and_change_nothing(client, admin_headers, endpoint, rdb):
    before = outgoing_keys(rdb)
    for data, status in BAD_CHANGES:
        response = client.patch(f"{BASE}/{endpoint['id']}", data=data, content_type=JSON, headers=admin_headers)
        assert response.status_code == status, (data, response.get_json())
    for body in ({"url": None}, {"channels": None}, {"disabled": None}, {"disabled": "yes"}):
        response = client.patch(f"{BASE}/{endpoint['id']}", json=body, headers=admin_headers)
        assert response.status_code == 400 and response.get_json()["error"]["code"] == "bad_request", body
    assert outgoing_keys(rdb) == before


def test_unknown_or_malformed_ids_are_404(client, admin_headers, endpoint):
    calls = []
    for endpoint_id in (UNKNOWN_ID, "nope", "ep_" + "0" * 31 + "Z", endpoint["id"] + "0"):
        calls += [
            ("GET", f"{BASE}/{endpoint_id}", None),
            ("PATCH", f"{BASE}/{endpoint_id}", {"description": "x"}),
            ("DELETE", f"{BASE}/{endpoint_id}", None),
            ("POST", f"{BASE}/{endpoint_id}/rotate-secret", None),
            ("GET", f"{BASE}/{endpoint_id}/messages", None),
            ("POST", f"{BASE}/{endpoint_id}/replay", {"since": "2026-01-01T00:00:00Z"}),
            ("POST", f"{BASE}/{endpoint_id}/messages/{UNKNOWN_MESSAGE}/retry", None),
        ]
    for message_id in (UNKNOWN_MESSAGE, "msg_1", "x"):
        calls.append(("POST", f"{BASE}/{endpoint['id']}/messages/{message_id}/retry", None))
    for method, path, body in calls:
        response = client.open(path, method=method, json=body, headers=admin_headers)
        assert response.status_code == 404, (method, path, response.get_json())
        assert response.get_json()["error"]["code"] == "not_found"


BAD_REPLAYS = [
    ({}, 400),
    ({"cursor": "x", "since": "2026-01-01T00:00:00Z"}, 400),
    ({"cursor": 5}, 400),
    ({"cursor": "!!not a cursor!!"}, 400),
    ({"cursor": base64.urlsafe_b64encode(json.dumps({"orders": "nope"}).encode()).decode()}, 400),
    ({"since": "yesterday"}, 422),
    ({"since": "2026-01-01T00:00:00"}, 422),  # no time zone
    ({"since": 1700000000}, 400),
]


def test_bad_replays_are_refused_and_change_nothing(client, admin_headers, endpoint, rdb):
    before = outgoing_keys(rdb)
    for body, status in BAD_REPLAYS:
        response = client.post(f"{BASE}/{endpoint['id']}/replay", json=body, headers=admin_headers)
        assert response.status_code == status, (body, response.get_json())
    assert outgoing_keys(rdb) == before


def test_a_disabled_endpoint_refuses_replays_and_retries_with_409(client, admin_headers, endpoint):
    client.patch(f"{BASE}/{endpoint['id']}", json={"disabled": True}, headers=admin_headers)
    response = client.post(
        f"{BASE}/{endpoint['id']}/replay", json={"since": "2026-01-01T00:00:00Z"}, headers=admin_headers
    )
    assert response.status_code == 409 and response.get_json()["error"]["code"] == "conflict"


def test_bad_message_queries_are_400(client, admin_headers, endpoint):
    for query in ("status=sent", "limit=0", "limit=1001", "limit=ten"):
        response = client.get(f"{BASE}/{endpoint['id']}/messages?{query}", headers=admin_headers)
        assert response.status_code == 400 and response.get_json()["error"]["code"] == "bad_request", query
