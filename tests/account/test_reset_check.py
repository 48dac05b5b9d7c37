"""`POST /auth/password/reset/check`: whether a reset link's token would still work, without using it, so that the
page can say a used or expired link is one when it opens, instead of after a new password was typed."""

from __future__ import annotations

import logging

from app.auth import mailtokens
from tests.account.test_mfa import settle
from tests.conftest import https_client

CHECK = "/auth/password/reset/check"
NEW_PASSWORD = "a password after the check"


def reset_token(app, user: dict) -> str:
    with app.app_context():
        return mailtokens.issue_token(user["id"], user["email"], mailtokens.RESET)


def test_a_usable_token_is_204_without_being_used_and_a_used_or_replaced_one_is_invalid(app, client, auth, caplog):
    caplog.set_level(logging.DEBUG)
    access = logging.getLogger("access")  # the request log does not propagate: listen to it too
    access.addHandler(caplog.handler)
    try:
        user = auth.register()
        older = reset_token(app, user)
        token = reset_token(app, user)  # the newer link replaces the older one
        for _ in range(2):  # checking does not use it
            answer = client.post(CHECK, json={"token": token})
            assert answer.status_code == 204 and answer.get_data() == b"", answer.get_data(as_text=True)
        replaced = client.post(CHECK, json={"token": older})
        assert replaced.status_code == 400 and replaced.get_json()["error"]["code"] == "invalid_token"

        assert (
            client.post("/auth/password/reset", json={"token": token, "new_password": NEW_PASSWORD}).status_code == 204
        )
        used = client.post(CHECK, json={"token": token})
        assert used.status_code == 400, used.get_data(as_text=True)
        assert used.get_json()["error"] == {
            "code": "invalid_token",
            "message": "This link is not valid (used, expired or replaced by a newer one).",
        }
    finally:
        access.removeHandler(caplog.handler)
    assert '"password.reset"' in caplog.text  # the logs of these requests were captured...
    assert token not in caplog.text and older not in caplog.text  # ...and hold no token


def test_a_malformed_request_is_a_clear_error_and_changes_nothing(app, client, auth):
    user = auth.register()
    token = reset_token(app, user)
    for body, status, code in (
        ({"token": "x" * 201}, 400, "invalid_token"),
        ({"token": ""}, 400, "invalid_token"),
        ({"token": "not.a-token"}, 400, "invalid_token"),
        ({"token": f"{user['id']}.{'A' * 43}"}, 400, "invalid_token"),
        ({}, 400, "bad_request"),
        ({"token": 7}, 400, "bad_request"),
    ):
        answer = client.post(CHECK, json=body)
        assert answer.status_code == status and answer.get_json()["error"]["code"] == code, (body, answer.get_json())
    assert client.post(CHECK, data="not json", content_type="application/json").status_code == 400
    assert client.post(CHECK, json={"token": token}).status_code == 204  # still usable


def test_checks_are_rate_limited_per_client_address_like_the_reset(make_app):
    app = make_app(RATE_LIMITS_ENABLED="true", RATE_LIMIT_PASSWORD="3/minute")
    client = https_client(app)
    settle()
    statuses = [client.post(CHECK, json={"token": f"guess-{n}"}).status_code for n in range(4)]
    assert statuses == [400, 400, 400, 429]
    other = client.post(CHECK, json={"token": "guess"}, environ_base={"REMOTE_ADDR": "10.0.9.9"})
    assert other.status_code == 400  # another address has its own budget
