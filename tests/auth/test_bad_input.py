"""Bad input gets a clear JSON 4xx and changes nothing in Redis."""

from __future__ import annotations

import base64
import json

import pytest

from tests.utils import DEFAULT_PASSWORD, bearer, random_email, redis_snapshot

pytestmark = pytest.mark.not_on_cluster(
    "parsing and validation come before any Redis call: the same code whatever the Redis"
)

JSON = "application/json"


def post(client, path, data, content_type=JSON, headers=None):
    return client.post(path, data=data, content_type=content_type, headers=headers or {})


BAD_REQUESTS = [
    ("/auth/register", "{not json", JSON, 400),
    ("/auth/register", '["a list"]', JSON, 400),
    ("/auth/register", '"a string"', JSON, 400),
    ("/auth/register", "{}", JSON, 400),
    ("/auth/register", '{"email": "a@example.com"}', JSON, 400),
    ("/auth/register", '{"email": 5, "password": "password123"}', JSON, 400),
    ("/auth/register", '{"email": "a@example.com", "password": ["x"]}', JSON, 400),
    ("/auth/register", '{"email": "a@example.com", "password": "password123"}', "text/plain", 415),
    ("/auth/register", "email=a@example.com&password=password123", "application/x-www-form-urlencoded", 415),
    ("/auth/register", b"\xff\xfe\x00", JSON, 400),
    ("/auth/login", '{"email": "a@example.com", "password": null}', JSON, 400),
    ("/auth/login", '{"email": "a@example.com", "password": "x", "transport": "carrier pigeon"}', JSON, 422),
    ("/auth/login", '{"email": "a@example.com", "password": "x", "transport": 1}', JSON, 400),
    ("/auth/login", '{"email": "a@example.com", "password": "x", "device": {"a": 1}}', JSON, 400),
    ("/auth/refresh", '{"refresh_token": 12345}', JSON, 400),
    ("/auth/refresh", "{broken", JSON, 400),
    ("/auth/refresh", "refresh_token=x", "text/plain", 415),
]


@pytest.mark.parametrize("path, data, content_type, status", BAD_REQUESTS)
def test_bad_body_is_a_json_4xx_and_changes_nothing(client, auth, rdb, path, data, content_type, status):
    auth.register()
    before = redis_snapshot(rdb)
    response = post(client, path, data, content_type)
    assert response.status_code == status
    error = response.get_json()["error"]
    assert set(error) == {"code", "message"} and error["code"] and error["message"]
    assert redis_snapshot(rdb) == before


@pytest.mark.parametrize("path", ["/auth/register", "/auth/login", "/auth/refresh", "/auth/password"])
def test_huge_body_is_413(client, auth, rdb, path):
    tokens = auth.new_user_tokens()
    before = redis_snapshot(rdb)
    big = '{"email": "a@example.com", "password": "' + "x" * (65 * 1024) + '"}'
    response = post(client, path, big, headers=bearer(tokens["access_token"]))
    assert response.status_code == 413
    assert response.get_json()["error"]["code"] == "payload_too_large"
    assert redis_snapshot(rdb) == before


def test_wrong_field_types_on_password_change(client, auth, rdb):
    tokens = auth.new_user_tokens()
    before = redis_snapshot(rdb)
    for body in ('{"current_password": 1, "new_password": "x"}', "{}", "[]"):
        response = post(client, "/auth/password", body, headers=bearer(tokens["access_token"]))
        assert response.status_code == 400
    assert redis_snapshot(rdb) == before


def test_malformed_authorization_header_is_401(client):
    for value in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "token abc"):
        response = client.get("/auth/me", headers={"Authorization": value})
        assert response.status_code == 401
        assert response.get_json()["error"]["code"] == "unauthorized"


def test_unknown_path_and_wrong_method_are_json(client):
    missing = client.get("/no/such/path")
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"
    wrong = client.get("/auth/login")
    assert wrong.status_code == 405 and wrong.get_json()["error"]["code"] == "method_not_allowed"
    assert set(wrong.headers["Allow"].replace(" ", "").split(",")) >= {"POST"}  # says which methods are


def test_login_answers_for_user_created_with_a_mixed_case_email(client, auth):
    user = auth.register()
    assert auth.login(user["email"].upper(), DEFAULT_PASSWORD).status_code == 200


# Hostile JSON: every JSON endpoint parses strictly, in one place (400), and nothing is written.

DEEP = "[" * 5000 + "]" * 5000
HOSTILE_JSON = {
    "NaN": '{"email": "a@example.com", "password": NaN, "current_password": NaN, "data": NaN}',
    "Infinity": '{"email": "a@example.com", "password": Infinity, "data": -Infinity}',
    "lone surrogate": '{"email": "\\ud800@example.com", "password": "\\udfff-password", "data": "\\ud800"}',
    "surrogate key": '{"\\ud800": 1, "email": "a@example.com", "password": "password123"}',
    "5000 deep": '{"email": "a@example.com", "password": "password123", "data": ' + DEEP + "}",
    "33 deep": '{"email": "a@example.com", "password": "password123", "data": ' + "[" * 32 + "]" * 32 + "}",
}
JSON_ENDPOINTS = ["/auth/register", "/auth/login", "/auth/refresh", "/auth/password", "/events"]


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
@pytest.mark.parametrize("body", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
def test_hostile_json_is_400_everywhere_and_changes_nothing(client, auth, rdb, path, body):
    tokens = auth.new_user_tokens()
    before = redis_snapshot(rdb)
    response = post(client, path, body, headers=bearer(tokens["access_token"]))
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["error"]["code"] == "bad_request"
    assert redis_snapshot(rdb) == before


def test_nesting_up_to_32_levels_is_accepted(client, auth):
    tokens = auth.new_user_tokens()
    data = "[" * 31 + "]" * 31  # the body object is the 32nd level
    body = f'{{"channel": "user:{tokens["user"]["id"]}", "event": "deep", "data": {data}}}'
    assert post(client, "/events", body, headers=bearer(tokens["access_token"])).status_code == 201


def test_an_over_long_password_is_a_plain_401_not_a_500(client, auth, rdb):
    user = auth.register()
    before = redis_snapshot(rdb)
    for password in ("x" * 5000, "x" * 4097, "x" * 1025):
        response = auth.login(user["email"], password)
        assert response.status_code == 401 and response.get_json()["error"]["code"] == "invalid_credentials"
    tokens = auth.login_body(user["email"])
    before = redis_snapshot(rdb)
    changed = client.post(
        "/auth/password",
        json={"current_password": "y" * 5000, "new_password": "another password"},
        headers=bearer(tokens["access_token"]),
    )
    assert changed.status_code == 401
    assert redis_snapshot(rdb) == before


CONTROL_CHARACTERS = ["\u0000", "\u001b[31m", "\u007f", "\u0085", "\n"]


@pytest.mark.parametrize("char", CONTROL_CHARACTERS, ids=repr)
def test_control_characters_in_stored_or_echoed_text_are_422(client, auth, rdb, char):
    tokens = auth.new_user_tokens()
    before = redis_snapshot(rdb)
    register = client.post("/auth/register", json={"email": f"a{char}b@example.com", "password": DEFAULT_PASSWORD})
    login = client.post(
        "/auth/login",
        json={"email": tokens["email"], "password": DEFAULT_PASSWORD, "transport": "body", "device": f"phone{char}"},
    )
    publish = client.post(
        "/events",
        json={"channel": f"user:{tokens['user']['id']}", "event": f"name{char}", "data": 1},
        headers=bearer(tokens["access_token"]),
    )
    for response in (register, login, publish):
        assert response.status_code == 422, response.get_json()
        assert response.get_json()["error"]["code"] == "validation_failed"
    assert redis_snapshot(rdb) == before


@pytest.mark.parametrize("suffix", [":tokens", "%3Atokens", "x", "/../x"])
def test_a_session_id_of_the_wrong_shape_is_404(client, auth, rdb, suffix):
    tokens = auth.new_user_tokens()
    before = redis_snapshot(rdb)
    response = client.delete(f"/auth/sessions/{tokens['session_id']}{suffix}", headers=bearer(tokens["access_token"]))
    assert response.status_code == 404 and response.get_json()["error"]["code"] == "not_found"
    assert redis_snapshot(rdb) == before
    assert client.get("/auth/me", headers=bearer(tokens["access_token"])).status_code == 200


def cursor_of(positions) -> str:
    return base64.urlsafe_b64encode(json.dumps(positions).encode()).rstrip(b"=").decode()


def hostile_cursors(channel: str) -> dict:
    return {
        "id over 2^64-1": cursor_of({channel: "18446744073709551616-0"}),
        "sequence over 2^64-1": cursor_of({channel: "1-18446744073709551616"}),
        "trailing newline": cursor_of({channel: "1-1\n"}),
        "deep": base64.urlsafe_b64encode(b"[" * 1000 + b"]" * 1000).rstrip(b"=").decode(),
        "NaN": base64.urlsafe_b64encode(b'{"x": NaN}').rstrip(b"=").decode(),
        "not base64": "!!!",
    }


@pytest.mark.parametrize("path", ["/events", "/events/wait?timeout=0", "/events/stream"])
def test_hostile_cursors_are_400_on_every_reading_endpoint(client, auth, rdb, path):
    tokens = auth.new_user_tokens()
    before = redis_snapshot(rdb)
    for name, cursor in hostile_cursors(f"user:{tokens['user']['id']}").items():
        separator = "&" if "?" in path else "?"
        response = client.get(f"{path}{separator}cursor={cursor}", headers=bearer(tokens["access_token"]))
        assert response.status_code == 400, (name, response.status_code)
        assert response.get_json()["error"]["code"] == "bad_request"
    largest = cursor_of({f"user:{tokens['user']['id']}": "18446744073709551615-18446744073709551615"})
    assert client.get(f"/events?cursor={largest}", headers=bearer(tokens["access_token"])).status_code == 204
    assert redis_snapshot(rdb) == before


NO_STORE_CALLS = {
    "register": lambda c, t: c.post("/auth/register", json={"email": random_email(), "password": DEFAULT_PASSWORD}),
    "login": lambda c, t: c.post(
        "/auth/login", json={"email": t["email"], "password": DEFAULT_PASSWORD, "transport": "body"}
    ),
    "refresh": lambda c, t: c.post("/auth/refresh", json={"refresh_token": t["refresh_token"]}),
    "me": lambda c, t: c.get("/auth/me", headers=bearer(t["access_token"])),
    "sessions": lambda c, t: c.get("/auth/sessions", headers=bearer(t["access_token"])),
    "an error": lambda c, t: c.get("/auth/me"),
}


@pytest.mark.parametrize("call", NO_STORE_CALLS.values(), ids=NO_STORE_CALLS.keys())
def test_answers_with_tokens_or_personal_data_are_never_cached(client, auth, call):
    response = call(client, auth.new_user_tokens())
    assert response.status_code < 500
    assert response.headers["Cache-Control"] == "no-store"
