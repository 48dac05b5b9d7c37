"""Rate limits on every endpoint that checks a secret, per client address and per account, in Redis."""

from __future__ import annotations

import pytest

from app.auth.devices import DEVICE_COOKIE
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email


def login(client, email, address, password=DEFAULT_PASSWORD, transport="cookie"):
    return client.post(
        "/auth/login",
        json={"email": email, "password": password, "transport": transport},
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


def test_answers_within_the_limit_count_down_without_retry_after(limited):
    client = limited()
    user = AuthActions(client).register()
    answer = login(client, user["email"], "203.0.113.9", transport="body")
    assert answer.status_code == 200
    assert (answer.headers["X-RateLimit-Limit"], answer.headers["X-RateLimit-Remaining"]) == ("3", "2")
    assert "Retry-After" not in answer.headers  # it means "wait": for refusals only


def test_per_account_limit_holds_across_addresses(limited):
    client = limited()
    user = AuthActions(client).register()
    answers = [login(client, user["email"], f"198.51.100.{n}", transport="body").status_code for n in range(4)]
    assert answers == [200, 200, 200, 429]


def test_guessing_an_account_does_not_lock_out_its_owners_known_device(limited):
    app_client = limited()
    owner_browser, attacker = https_client(app_client.application), https_client(app_client.application)
    user = AuthActions(owner_browser).register()
    assert login(owner_browser, user["email"], "192.0.2.1").status_code == 200  # the device cookie is set
    assert owner_browser.get_cookie(DEVICE_COOKIE, path="/auth/login") is not None
    guesses = [
        login(attacker, user["email"], f"198.51.100.{n}", password=f"guess-{n}-password").status_code for n in range(4)
    ]
    assert guesses == [401, 401, 429, 429]  # the owner's first login counted in the account's bucket
    assert login(attacker, user["email"], "198.51.100.9").status_code == 429  # even with the right password
    assert login(owner_browser, user["email"], "192.0.2.1").status_code == 200


def test_a_known_device_has_its_own_limit_and_only_for_its_account(limited):
    client = limited()
    actions = AuthActions(client)
    user, other = actions.register(), actions.register()
    assert login(client, user["email"], "192.0.2.1").status_code == 200
    wrong = [login(client, user["email"], f"198.51.100.{n}", password="wrong-password").status_code for n in range(4)]
    assert wrong == [401, 401, 401, 429]  # the device's own bucket holds 3 (its first login was the account's)
    # The device cookie names `user`, not `other`: guesses at `other` count in other's account bucket.
    assert [login(client, other["email"], f"203.0.113.{n}", "bad").status_code for n in range(4)] == [
        401,
        401,
        401,
        429,
    ]


def test_password_change_is_limited_per_caller_across_addresses(limited):
    client = limited(RATE_LIMIT_PASSWORD="3/minute")
    tokens = AuthActions(client).new_user_tokens()
    answers = [
        client.post(
            "/auth/password",
            json={"current_password": f"guess-{n}-password", "new_password": "a new password 123"},
            headers={**bearer(tokens["access_token"]), "X-Forwarded-For": f"198.51.100.{n}"},
        ).status_code
        for n in range(4)
    ]
    assert answers == [401, 401, 401, 429]
    right = client.post(
        "/auth/password",
        json={"current_password": DEFAULT_PASSWORD, "new_password": "a new password 123"},
        headers={**bearer(tokens["access_token"]), "X-Forwarded-For": "198.51.100.77"},
    )
    assert right.status_code == 429 and right.get_json()["error"]["code"] == "rate_limited"


def test_forwarded_headers_from_an_untrusted_peer_are_ignored(limited):
    client = limited(FORWARDED_ALLOW_IPS="10.0.0.0/8")  # the test client's own 127.0.0.1 is not a proxy
    answers = [login(client, random_email(), f"192.0.2.{n}").status_code for n in range(4)]
    assert answers == [401, 401, 401, 429]  # every invented address is the one peer
    trusted = limited(FORWARDED_ALLOW_IPS="127.0.0.0/30")
    assert [login(trusted, random_email(), f"192.0.2.{n}").status_code for n in range(4)] == [401] * 4


def test_a_spoofed_forwarded_header_does_not_escape_the_limit_without_a_proxy(limited):
    client = limited(PROXY_HOPS="0")  # no trusted proxy: X-Forwarded-For is the client's own claim
    answers = [login(client, random_email(), f"192.0.2.{n}").status_code for n in range(4)]
    assert answers == [401, 401, 401, 429]


def login_from(client, address: str, via_proxy: bool = False):
    """A failed login from a client at `address`: the direct peer, or the one the trusted proxy names."""
    body = {"email": random_email(), "password": DEFAULT_PASSWORD}
    if via_proxy:
        return client.post("/auth/login", json=body, headers={"X-Forwarded-For": address})
    return client.post("/auth/login", json=body, environ_base={"REMOTE_ADDR": address})


@pytest.mark.parametrize("via_proxy", [False, True], ids=["peer", "proxied"])
def test_an_ipv6_client_is_counted_by_its_64(limited, via_proxy):
    client = limited()
    one_64 = ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2:a:b:c:d"]
    assert [login_from(client, address, via_proxy).status_code for address in one_64] == [401, 401, 401, 429]
    assert login_from(client, "2001:0db8:0001:0002:0000:0000:0000:0099", via_proxy).status_code == 429
    assert login_from(client, "2001:db8:1:3::1", via_proxy).status_code == 401  # the next /64 is someone else
    assert login_from(client, "2001:db8:1:2::", via_proxy).status_code == 429


def test_an_ipv4_mapped_ipv6_address_counts_as_its_ipv4(limited):
    client = limited()
    same = ["::ffff:203.0.113.5", "203.0.113.5", "::ffff:cb00:7105", "203.0.113.5"]
    assert [login_from(client, address).status_code for address in same] == [401, 401, 401, 429]
    assert login_from(client, "::ffff:203.0.113.6").status_code == 401  # its neighbour, as for any IPv4 address
    assert login_from(client, "203.0.113.6").status_code == 401


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
