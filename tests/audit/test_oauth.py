"""OAuth logins are logins too: recorded with their method and provider, against a real OpenID provider."""

from __future__ import annotations

import time

import pyotp
import requests

from app.audit.entries import from_member
from app.redis import Keys
from tests.auth.test_oauth import browser, callback_url, finish, oauth_setup, secure_cookies_to_loopback
from tests.utils import DEFAULT_PASSWORD, random_email

__all__ = ["oauth_setup", "secure_cookies_to_loopback"]  # the fixtures this module uses from there

USER = "user"


def entries_about(rdb, user_id: str) -> list[dict]:
    """The user's entries as stored in their subject's index, oldest first."""
    return [from_member(member) for member in rdb.zrange(Keys.audit_subject(user_id), 0, -1)]


def summary(entries: list[dict]) -> list[tuple]:
    """Each entry's type, actor kind, address and method."""
    return [(e["type"], e["actor"]["kind"], e.get("ip"), e["details"].get("method")) for e in entries]


def test_a_provider_login_records_the_account_and_the_login(oauth_setup, redis_server):
    app, provider = oauth_setup
    client = browser()
    assert finish(client, callback_url(client, app, provider, random_email())).status_code == 302
    user_id = client.get(f"{app.url}/auth/me").json()["user"]["id"]
    entries = entries_about(redis_server.client(), user_id)
    assert summary(entries) == [
        ("user.registered", USER, "127.0.0.1", "oauth"),
        ("login.succeeded", USER, "127.0.0.1", "oauth"),
    ]
    assert {entry["actor"]["id"] for entry in entries} == {user_id}
    assert entries[1]["details"]["provider"] == "test"
    assert entries[1]["details"]["session_id"] == client.get(f"{app.url}/auth/me").json()["session_id"]


def test_a_takeover_and_a_second_factor_after_a_provider_login_are_recorded(oauth_setup, redis_server):
    app, provider = oauth_setup
    email = random_email()
    user_id = requests.post(f"{app.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}).json()[
        "user"
    ]["id"]
    victim = browser()
    assert finish(victim, callback_url(victim, app, provider, email)).status_code == 302
    entries = entries_about(redis_server.client(), user_id)
    assert summary(entries) == [
        ("user.registered", USER, "127.0.0.1", "password"),
        ("email.verified", USER, "127.0.0.1", "oauth"),
        ("login.succeeded", USER, "127.0.0.1", "oauth"),
    ]
    assert entries[1]["details"] == {"method": "oauth", "provider": "test", "account_taken_over": True}

    secret = victim.post(f"{app.url}/auth/mfa/totp/setup").json()["secret"]
    assert victim.post(f"{app.url}/auth/mfa/totp/confirm", json={"code": pyotp.TOTP(secret).now()}).status_code == 200
    client = browser()
    response = finish(client, callback_url(client, app, provider, email))
    mfa_token = response.headers["Location"].partition("#mfa_token=")[2]
    body = {"mfa_token": mfa_token, "code": pyotp.TOTP(secret).at(time.time() + 30), "transport": "body"}
    assert client.post(f"{app.url}/auth/login/mfa", json=body).status_code == 200
    last = entries_about(redis_server.client(), user_id)[-1]
    assert last["type"] == "login.succeeded"
    assert last["details"]["method"] == "oauth" and last["details"]["second_factor"] == "totp"
