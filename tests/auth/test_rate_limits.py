"""Rate limits on login, register and refresh, per client address and per account, counted in Redis."""

from __future__ import annotations

import pytest

from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, random_email


def login(client, email, address):
    return client.post(
        "/auth/login",
        json={"email": email, "password": DEFAULT_PASSWORD},
        headers={"X-Forwarded-For": address},
    )


@pytest.fixture
def limited(make_app):
    def make(**overrides):
        settings = {"RATE_LIMITS_ENABLED": "true", "RATE_LIMIT_LOGIN": "3/minute", **overrides}
        return https_client(make_app(**settings))

    return make


def test_per_address_limit_answers_429_with_retry_after(limited):
    client = limited()
    answers = [login(client, random_email(), "203.0.113.7").status_code for _ in range(4)]
    assert answers == [401, 401, 401, 429]
    response = login(client, random_email(), "203.0.113.7")
    assert response.status_code == 429
    assert response.get_json()["error"]["code"] == "rate_limited"
    assert 0 < int(response.headers["Retry-After"]) <= 60
    assert login(client, random_email(), "203.0.113.8").status_code == 401  # another address is not limited


def test_per_account_limit_holds_across_addresses(limited):
    client = limited()
    user = AuthActions(client).register()
    answers = [login(client, user["email"], f"198.51.100.{n}").status_code for n in range(4)]
    assert answers == [200, 200, 200, 429]


def test_a_spoofed_forwarded_header_does_not_escape_the_limit_without_a_proxy(limited):
    client = limited(PROXY_HOPS="0")  # no trusted proxy: X-Forwarded-For is the client's own claim
    answers = [login(client, random_email(), f"192.0.2.{n}").status_code for n in range(4)]
    assert answers == [401, 401, 401, 429]


def test_register_and_refresh_are_limited(limited):
    client = limited(RATE_LIMIT_REGISTER="2/minute", RATE_LIMIT_REFRESH="2/minute")
    registers = [
        client.post("/auth/register", json={"email": random_email(), "password": DEFAULT_PASSWORD}).status_code
        for _ in range(3)
    ]
    assert registers == [201, 201, 429]
    refreshes = [client.post("/auth/refresh", json={"refresh_token": "x" * 43}).status_code for _ in range(3)]
    assert refreshes == [401, 401, 429]


def test_limits_can_be_switched_off_for_load_tests(make_app):
    client = https_client(make_app(RATE_LIMITS_ENABLED="false", RATE_LIMIT_LOGIN="1/minute"))
    assert {login(client, random_email(), "203.0.113.9").status_code for _ in range(5)} == {401}
