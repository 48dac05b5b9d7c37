"""Cookie transport (attributes parsed from Set-Cookie), the CSRF Origin rule, and CORS kept apart from it."""

from __future__ import annotations

import pytest

from app.auth.cookies import ACCESS_COOKIE, REFRESH_COOKIE
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, bearer, parse_set_cookies

OWN_ORIGIN = "https://localhost"
EVIL_ORIGIN = "https://evil.example"
FRIEND_ORIGIN = "https://app.example"


@pytest.fixture
def browser(client, auth):
    """A browser logged in with the cookie transport (the default)."""
    user = auth.register()
    response = client.post("/auth/login", json={"email": user["email"], "password": DEFAULT_PASSWORD})
    assert response.status_code == 200
    return client, user, response


def test_cookie_login_sets_strict_httponly_secure_cookies_and_no_tokens_in_body(browser):
    _, _, response = browser
    cookies = parse_set_cookies(response.headers.getlist("Set-Cookie"))
    access, refresh = cookies[ACCESS_COOKIE], cookies[REFRESH_COOKIE]
    for cookie in (access, refresh):
        assert cookie["httponly"] is True and cookie["secure"] is True
        assert cookie["samesite"] == "Strict"
        assert "domain" not in cookie
    assert access["path"] == "/" and access["max-age"] == "900"
    assert refresh["path"] == "/auth" and int(refresh["max-age"]) > 900
    body = response.get_json()
    assert "access_token" not in body and "refresh_token" not in body
    assert body["token_type"] == "Bearer" and body["expires_in"] == 900 and body["session_id"]


def test_body_transport_sets_no_cookie(client, auth):
    user = auth.register()
    response = auth.login(user["email"], transport="body")
    assert response.headers.getlist("Set-Cookie") == []
    assert {"access_token", "refresh_token", "refresh_expires_in"} <= set(response.get_json())


def test_cookie_session_authenticates_refreshes_and_logs_out(browser):
    client, _, login = browser
    assert client.get("/auth/me").status_code == 200
    refreshed = client.post("/auth/refresh", headers={"Origin": OWN_ORIGIN})
    assert refreshed.status_code == 200
    assert "refresh_token" not in refreshed.get_json()
    old_refresh = parse_set_cookies(login.headers.getlist("Set-Cookie"))[REFRESH_COOKIE]["value"]
    new_refresh = parse_set_cookies(refreshed.headers.getlist("Set-Cookie"))[REFRESH_COOKIE]["value"]
    assert new_refresh != old_refresh
    logout = client.post("/auth/logout", headers={"Origin": OWN_ORIGIN})
    assert logout.status_code == 204
    cleared = parse_set_cookies(logout.headers.getlist("Set-Cookie"))
    assert cleared[ACCESS_COOKIE]["max-age"] == "0" and cleared[REFRESH_COOKIE]["max-age"] == "0"
    assert client.get("/auth/me").status_code == 401


def test_cross_site_cookie_request_is_refused_and_changes_nothing(browser):
    client, _, _ = browser
    response = client.post("/auth/logout-all", headers={"Origin": EVIL_ORIGIN})
    assert response.status_code == 403
    assert response.get_json()["error"]["code"] == "csrf_rejected"
    assert client.get("/auth/me").status_code == 200  # still logged in


def test_cross_site_fetch_without_origin_is_refused_by_sec_fetch_site(browser):
    client, _, _ = browser
    response = client.post("/auth/logout-all", headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 403
    assert client.get("/auth/me").status_code == 200


def test_null_origin_is_refused(browser):
    client, _, _ = browser
    assert client.post("/auth/logout-all", headers={"Origin": "null"}).status_code == 403


def test_same_origin_cookie_request_is_allowed(browser):
    client, _, _ = browser
    assert (
        client.post("/auth/logout-all", headers={"Origin": OWN_ORIGIN, "Sec-Fetch-Site": "same-origin"}).status_code
        == 204
    )


def test_allowed_origin_is_allowed_and_gets_cors_headers(make_app, auth):
    client = https_client(make_app(ALLOWED_ORIGINS=FRIEND_ORIGIN))
    user = auth.register()
    client.post(
        "/auth/login", json={"email": user["email"], "password": DEFAULT_PASSWORD}, headers={"Origin": FRIEND_ORIGIN}
    )
    response = client.get("/auth/me", headers={"Origin": FRIEND_ORIGIN})
    assert response.status_code == 200
    assert response.headers["Access-Control-Allow-Origin"] == FRIEND_ORIGIN
    assert response.headers["Access-Control-Allow-Credentials"] == "true"
    assert client.post("/auth/logout-all", headers={"Origin": FRIEND_ORIGIN}).status_code == 204


def test_cors_says_nothing_to_other_origins_and_that_is_not_the_csrf_defence(browser):
    client, _, _ = browser
    read = client.get("/auth/me", headers={"Origin": EVIL_ORIGIN})
    assert read.status_code == 200  # a GET is processed; only the browser's read is blocked by CORS
    assert "Access-Control-Allow-Origin" not in read.headers
    assert client.post("/auth/logout-all", headers={"Origin": EVIL_ORIGIN}).status_code == 403


def test_preflight_for_allowed_origin(make_app):
    client = https_client(make_app(ALLOWED_ORIGINS=FRIEND_ORIGIN))
    headers = {"Origin": FRIEND_ORIGIN, "Access-Control-Request-Method": "POST"}
    response = client.options("/auth/logout-all", headers=headers)
    assert response.status_code == 204
    assert "POST" in response.headers["Access-Control-Allow-Methods"]
    assert response.headers["Access-Control-Allow-Origin"] == FRIEND_ORIGIN
    refused = client.options("/auth/logout-all", headers={**headers, "Origin": EVIL_ORIGIN})
    assert "Access-Control-Allow-Origin" not in refused.headers


def test_bearer_requests_are_not_subject_to_the_origin_rule(client, auth):
    tokens = auth.new_user_tokens()
    response = client.post("/auth/logout-all", headers={**bearer(tokens["access_token"]), "Origin": EVIL_ORIGIN})
    assert response.status_code == 204


def test_cross_site_login_is_refused(client, auth):
    """Login CSRF: a foreign page must not log the browser into the attacker's account."""
    user = auth.register()
    response = client.post(
        "/auth/login", json={"email": user["email"], "password": DEFAULT_PASSWORD}, headers={"Origin": EVIL_ORIGIN}
    )
    assert response.status_code == 403
    assert response.headers.getlist("Set-Cookie") == []
