"""Bad input gets a clear JSON 4xx and changes nothing in Redis."""

from __future__ import annotations

import pytest

from tests.utils import DEFAULT_PASSWORD, bearer, redis_snapshot

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


def test_login_answers_for_user_created_with_a_mixed_case_email(client, auth):
    user = auth.register()
    assert auth.login(user["email"].upper(), DEFAULT_PASSWORD).status_code == 200
