"""REQUIRE_VERIFIED_EMAIL: an account whose address is not verified cannot log in (403), a wrong
password is still 401, and the refused login sends a fresh link (at most once per cool-down)."""

from __future__ import annotations

import pytest

from app.redis import Keys
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions


@pytest.fixture
def strict(make_app):
    client = https_client(make_app(REQUIRE_VERIFIED_EMAIL="true"))
    return client, AuthActions(client)


def queued(rdb, kind: str) -> list[dict]:
    jobs = [rdb.hgetall(key) for key in rdb.scan_iter(Keys.mail_job("*"))]
    return [job for job in jobs if job["kind"] == kind]


def test_unverified_accounts_cannot_log_in_and_get_a_fresh_link(strict, rdb):
    client, auth = strict
    user = auth.register()
    assert len(queued(rdb, "verify_email")) == 1  # registration queued the first mail
    refused = auth.login(user["email"])
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "email_not_verified"
    assert len(queued(rdb, "verify_email")) == 2  # the refused login queued a new one...
    assert auth.login(user["email"]).status_code == 403
    assert len(queued(rdb, "verify_email")) == 2  # ...once per cool-down, not per attempt
    wrong = auth.login(user["email"], "a wrong password")
    assert wrong.status_code == 401 and wrong.get_json()["error"]["code"] == "invalid_credentials"
    unknown = auth.login("nobody@example.com")
    assert unknown.status_code == 401 and unknown.get_json()["error"]["code"] == "invalid_credentials"


def test_a_verified_account_logs_in(strict, rdb):
    client, auth = strict
    user = auth.register()
    rdb.hset(Keys.user(user["id"]), "email_verified", "1")  # what POST /auth/email/verify does
    assert auth.login(user["email"]).status_code == 200


def test_without_the_setting_unverified_accounts_log_in(client, auth):
    user = auth.register()
    answer = auth.login(user["email"])
    assert answer.status_code == 200 and answer.get_json()["user"]["email_verified"] is False


@pytest.mark.parametrize("path", ["/auth/email/verify", "/auth/password/reset"])
def test_mailed_tokens_in_the_wrong_place_or_shape_are_invalid(client, path):
    body = {"token": "x" * 43, "new_password": DEFAULT_PASSWORD}
    answer = client.post(path, json=body)
    assert answer.status_code == 400 and answer.get_json()["error"]["code"] == "invalid_token"
    assert client.post(path, json={**body, "token": 7}).status_code == 400
