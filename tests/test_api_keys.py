"""API keys, token introspection and batch publishing: credentials for backends."""

from __future__ import annotations

import time

import jwt
import pytest
import requests

from app.apikeys.store import create_key, delete_key
from app.auth.users import create_user
from tests.conftest import TEST_JWT_SECRET
from tests.servers import LiveServer
from tests.utils import DEFAULT_PASSWORD, bearer, random_email, redis_snapshot


@pytest.fixture
def admin(app, auth):
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin")
    return auth.login_body(email)


@pytest.fixture
def make_key(client, admin):
    def make(scopes=("events:publish",), channels=("user:*",), name="billing backend"):
        body = {"name": name, "scopes": list(scopes), "channels": list(channels)}
        response = client.post("/admin/api-keys", json=body, headers=bearer(admin["access_token"]))
        assert response.status_code == 201, response.get_json()
        return response.get_json()

    return make


def publish(client, key: str, channel: str, event: str = "order.paid", data=None):
    return client.post("/events", json={"channel": channel, "event": event, "data": data}, headers=bearer(key))


def introspect(client, key: str, token: str):
    return client.post("/auth/introspect", data={"token": token}, headers=bearer(key))


def test_a_key_is_shown_once_and_stored_only_as_its_hash(client, admin, make_key, rdb):
    created = make_key(name="billing")
    key = created["key"]
    assert key.startswith("ak_") and len(key) >= 3 + 43  # 256 bits, base64url
    assert set(created) == {"id", "name", "scopes", "channels", "created_at", "last_used_at", "key"}
    assert (created["name"], created["scopes"], created["channels"]) == ("billing", ["events:publish"], ["user:*"])
    assert key not in repr(redis_snapshot(rdb))  # only its SHA-256 is kept
    listed = client.get("/admin/api-keys", headers=bearer(admin["access_token"]))
    assert listed.headers["Cache-Control"] == "no-store"
    assert listed.get_json()["api_keys"] == [{k: v for k, v in created.items() if k != "key"}]


def test_only_admins_manage_keys(client, auth, make_key):
    user = auth.new_user_tokens()
    body = {"name": "x", "scopes": ["events:publish"], "channels": ["*"]}
    assert client.post("/admin/api-keys", json=body, headers=bearer(user["access_token"])).status_code == 403
    assert client.get("/admin/api-keys", headers=bearer(user["access_token"])).status_code == 403
    key = make_key(scopes=("events:publish", "tokens:introspect", "webhooks:manage"), channels=("*",))["key"]
    assert client.get("/admin/api-keys", headers=bearer(key)).status_code == 403  # keys do not manage keys
    assert client.get("/admin/api-keys").status_code == 401


@pytest.mark.parametrize(
    "body",
    [
        {"name": "x", "scopes": ["events:publish"]},  # publishing needs channels
        {"name": "x", "scopes": ["root"], "channels": ["*"]},
        {"name": "x", "scopes": [], "channels": ["*"]},
        {"name": "", "scopes": ["tokens:introspect"]},
        {"name": "a\u001bb", "scopes": ["tokens:introspect"]},
        {"name": "x", "scopes": ["events:publish"], "channels": ["user:**"]},
    ],
)
def test_bad_key_requests_are_422_and_store_nothing(client, admin, rdb, body):
    before = redis_snapshot(rdb)
    response = client.post("/admin/api-keys", json=body, headers=bearer(admin["access_token"]))
    assert response.status_code == 422 and response.get_json()["error"]["code"] == "validation_failed"
    assert redis_snapshot(rdb) == before


def test_a_key_publishes_only_to_its_channels(client, make_key):
    users_only = make_key(channels=("user:*",))["key"]
    assert publish(client, users_only, "user:abc").status_code == 201
    refused = publish(client, users_only, "broadcast")
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "forbidden"
    exact = make_key(channels=("orders",))["key"]
    assert publish(client, exact, "orders").status_code == 201
    assert publish(client, exact, "orders2").status_code == 403
    assert publish(client, make_key(channels=("*",))["key"], "broadcast").status_code == 201


def test_scope_unknown_and_deleted_keys(client, admin, make_key):
    introspect_only = make_key(scopes=("tokens:introspect",), channels=())["key"]
    assert publish(client, introspect_only, "user:abc").status_code == 403  # outside its scope
    assert publish(client, "ak_" + "x" * 43, "user:abc").status_code == 401  # unknown
    created = make_key()
    assert client.get("/auth/me", headers=bearer(created["key"])).status_code == 403  # users' endpoints
    assert client.get("/auth/me", headers=bearer("ak_unknown")).status_code == 401
    deleted = client.delete(f"/admin/api-keys/{created['id']}", headers=bearer(admin["access_token"]))
    assert deleted.status_code == 204
    assert publish(client, created["key"], "user:abc").status_code == 401  # at once
    again = client.delete(f"/admin/api-keys/{created['id']}", headers=bearer(admin["access_token"]))
    assert again.status_code == 404
    assert client.delete("/admin/api-keys/not-an-id", headers=bearer(admin["access_token"])).status_code == 404


def test_last_used_at_is_written_on_first_use_and_not_on_every_request(client, admin, make_key, rdb):
    created = make_key()
    assert created["last_used_at"] is None
    publish(client, created["key"], "user:abc")
    first = rdb.hget(f"apikey:{_hash(created['key'])}", "last_used_at")
    assert first
    publish(client, created["key"], "user:abc")
    assert rdb.hget(f"apikey:{_hash(created['key'])}", "last_used_at") == first  # within the minute
    listed = client.get("/admin/api-keys", headers=bearer(admin["access_token"])).get_json()["api_keys"]
    assert listed[0]["last_used_at"] is not None


def _hash(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()


def test_introspection_applies_every_rule_the_service_applies(client, auth, make_key):
    key = make_key(scopes=("tokens:introspect",), channels=())["key"]
    user = auth.new_user_tokens()
    answer = introspect(client, key, user["access_token"])
    assert answer.status_code == 200
    claims = jwt.decode(user["access_token"], options={"verify_signature": False})
    assert answer.get_json() == {
        "active": True,
        "sub": claims["sub"],
        "role": "user",
        "sid": claims["sid"],
        "ver": claims["ver"],
        "exp": claims["exp"],
        "iat": claims["iat"],
        "iss": claims["iss"],
        "aud": claims["aud"],
        "token_type": "access_token",
    }
    expired = jwt.encode(
        {**claims, "iat": int(time.time()) - 1000, "exp": int(time.time()) - 100},
        TEST_JWT_SECRET,
        algorithm="HS256",
        headers={"typ": "at+jwt"},
    )
    for inactive in ("garbage", "a.b.c", user["refresh_token"], expired):
        assert introspect(client, key, inactive).get_json() == {"active": False}
    assert client.post("/auth/logout-all", headers=bearer(user["access_token"])).status_code == 204
    assert introspect(client, key, user["access_token"]).get_json() == {"active": False}  # logout-all at once


def test_introspection_needs_a_key_with_its_scope_and_a_form(client, auth, make_key):
    user = auth.new_user_tokens()
    assert client.post("/auth/introspect", data={"token": user["access_token"]}).status_code == 401
    as_user = client.post("/auth/introspect", data={"token": "x"}, headers=bearer(user["access_token"]))
    assert as_user.status_code == 401  # a user's token is no API key
    publisher = make_key()["key"]
    assert introspect(client, publisher, user["access_token"]).status_code == 403
    key = make_key(scopes=("tokens:introspect",), channels=())["key"]
    assert client.post("/auth/introspect", json={"token": "x"}, headers=bearer(key)).status_code == 415
    form = "application/x-www-form-urlencoded"
    assert client.post("/auth/introspect", data="other=1", content_type=form, headers=bearer(key)).status_code == 400


def test_a_batch_is_published_in_order_all_at_once(client, auth, make_key):
    key = make_key(channels=("user:*", "orders"))["key"]
    reader = auth.new_user_tokens()
    cursor = client.get("/events", headers=bearer(reader["access_token"])).headers["Event-Cursor"]
    channel = f"user:{reader['user']['id']}"
    events = [{"channel": channel, "event": f"step.{n}", "data": {"n": n}} for n in range(5)]
    events.insert(2, {"channel": "orders", "event": "order.paid", "data": None})
    answer = client.post("/events/batch", json={"events": events}, headers=bearer(key))
    assert answer.status_code == 201 and len(answer.get_json()["ids"]) == 6
    seen = client.get(f"/events?cursor={cursor}", headers=bearer(reader["access_token"])).get_json()["events"]
    assert [e["event"] for e in seen] == [f"step.{n}" for n in range(5)]  # the reader's own, in order
    own = client.post(
        "/events/batch",
        json={"events": [{"channel": channel, "event": "mine", "data": 1}]},
        headers=bearer(reader["access_token"]),
    )
    assert own.status_code == 201  # users batch to their own channel too


@pytest.mark.parametrize(
    "events, status",
    [
        ([{"channel": "user:a", "event": "ok", "data": n} for n in range(101)], 422),
        ([], 422),
        ([{"channel": "user:a", "event": "ok"}, {"channel": "user:a", "event": "bad name"}], 422),
        ([{"channel": "user:a", "event": "ok"}, {"channel": "broadcast", "event": "ok"}], 403),
        ([{"channel": "user:a", "event": "ok"}, "not an object"], 400),
        ([{"channel": "user:a", "event": "ok"}, {"channel": "user:a"}], 400),
        ([{"channel": "user:a", "event": "ok"}, {"channel": "user:a", "event": "big", "data": "x" * 70000}], 413),
    ],
)
def test_a_bad_batch_appends_nothing(client, make_key, rdb, events, status):
    key = make_key()["key"]
    before = redis_snapshot(rdb, ignore_prefixes=("ratelimit", "apikey"))
    answer = client.post("/events/batch", json={"events": events}, headers=bearer(key))
    assert answer.status_code == status, answer.get_json()
    assert redis_snapshot(rdb, ignore_prefixes=("ratelimit", "apikey")) == before


def test_the_cli_creates_lists_and_deletes_keys(app, client):
    runner = app.test_cli_runner()

    def flask(*args):
        with app.app_context():  # as `flask --app wsgi` provides
            return runner.invoke(args=list(args))

    created = flask("api-keys", "create", "--name", "cli", "--scope", "events:publish", "--channel", "*")
    assert created.exit_code == 0, created.output
    key = created.stdout.strip().splitlines()[0]
    assert key.startswith("ak_")
    assert publish(client, key, "broadcast").status_code == 201
    listed = flask("api-keys", "list")
    key_id = listed.stdout.split()[0]
    assert "cli" in listed.stdout and key not in listed.stdout
    assert flask("api-keys", "delete", key_id).exit_code == 0
    assert publish(client, key, "broadcast").status_code == 401
    refused = flask("api-keys", "create", "--name", "x", "--scope", "root")
    assert refused.exit_code != 0 and "Scopes must be" in refused.output


def test_a_deleted_key_stops_working_at_once_on_every_worker_and_instance(app, base_env, tmp_path):
    instances = [LiveServer(base_env, workers=2, log_path=tmp_path / f"app-{n}.log") for n in range(2)]
    try:
        for instance in instances:
            instance.start()
        with app.app_context():
            raw, key = create_key("fleet", ["events:publish"], ["*"])

        def answers():  # several requests per instance, so both workers of the first one answer
            body = {"channel": "broadcast", "event": "fleet.ping", "data": None}
            return {
                requests.post(f"{i.url}/events", json=body, headers=bearer(raw), timeout=5).status_code
                for i in instances
                for _ in range(6)
            }

        assert answers() == {201}
        with app.app_context():
            assert delete_key(key["id"])
        assert answers() == {401}  # no cache anywhere to wait for
    finally:
        for instance in instances:
            instance.stop()
