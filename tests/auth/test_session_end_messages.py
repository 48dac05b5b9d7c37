"""What a refused refresh says (issue 33): a token whose session had already ended, by whatever route,
is told so, and is neither counted nor handled as a reuse; a rotated-away token presented while its
session lives is reuse, as before."""

from __future__ import annotations

import contextlib

import pytest
from prometheus_client import REGISTRY

from app.auth import mailtokens, sessions
from app.auth.users import create_user
from app.redis import Keys
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, parse_set_cookies, random_email

ENDED = "This session has ended (logged out, here or on another device); log in again."
REUSED = "This refresh token was already used; the session has been ended. Log in again."


def refresh(client, token: str):
    return client.post("/auth/refresh", json={"refresh_token": token})


def refreshes_counted(outcome: str) -> float:
    return REGISTRY.get_sample_value("auth_refreshes_total", {"outcome": outcome}) or 0.0


@contextlib.contextmanager
def ended_sessions(app):
    """The session ids that `sessions_ended` announces (to close live connections) while the block runs."""
    announced = []

    def receiver(_sender, **details):
        announced.extend(details["session_ids"])

    with sessions.sessions_ended.connected_to(receiver, app):
        yield announced


def _logout(client, app, phone, other):
    assert client.post("/auth/logout", headers=bearer(phone["access_token"])).status_code == 204


def _logout_with_refresh_token(client, app, phone, other):
    assert client.post("/auth/logout", json={"refresh_token": phone["refresh_token"]}).status_code == 204


def _logout_all_elsewhere(client, app, phone, other):
    assert client.post("/auth/logout-all", headers=bearer(other["access_token"])).status_code == 204


def _ended_from_another_device(client, app, phone, other):
    path = f"/auth/sessions/{phone['session_id']}"
    assert client.delete(path, headers=bearer(other["access_token"])).status_code == 204


def _password_changed_elsewhere(client, app, phone, other):
    body = {"current_password": DEFAULT_PASSWORD, "new_password": "a brand new password"}
    assert client.post("/auth/password", json=body, headers=bearer(other["access_token"])).status_code == 204


def _password_reset(client, app, phone, other):
    with app.app_context():
        token = mailtokens.issue_token(phone["user"]["id"], phone["user"]["email"], mailtokens.RESET)
    answer = client.post("/auth/password/reset", json={"token": token, "new_password": "a brand new password"})
    assert answer.status_code == 204


def _admin_revoke(client, app, phone, other):
    email = random_email()
    with app.app_context():
        create_user(email, DEFAULT_PASSWORD, role="admin", email_verified=True)
    admin = client.post("/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"})
    path = f"/admin/users/{phone['user']['id']}/sessions"
    assert client.delete(path, headers=bearer(admin.get_json()["access_token"])).status_code == 204


def _reuse_detected(client, app, phone, other):
    """A thief's replay of the phone's first token ends the session; the phone still holds the newest."""
    rotated = refresh(client, phone["refresh_token"]).get_json()
    assert refresh(client, phone["refresh_token"]).get_json()["error"]["message"] == REUSED
    phone["refresh_token"] = rotated["refresh_token"]


ENDINGS = {
    "logout": _logout,
    "logout-by-refresh-token": _logout_with_refresh_token,
    "logout-all-elsewhere": _logout_all_elsewhere,
    "ended-from-another-device": _ended_from_another_device,
    "password-changed-elsewhere": _password_changed_elsewhere,
    "password-reset": _password_reset,
    "admin-revoke": _admin_revoke,
    "reuse-detected-earlier": _reuse_detected,
}


@pytest.mark.parametrize("end", ENDINGS.values(), ids=ENDINGS.keys())
def test_a_refresh_after_the_session_ended_says_it_ended_and_is_no_reuse(app, client, auth, rdb, end):
    user = auth.register()
    phone, other = (auth.login_body(user["email"], device=name) for name in ("phone", "laptop"))
    end(client, app, phone, other)
    assert not rdb.exists(Keys.session(user["id"], phone["session_id"]))
    reused_before, ended_before = refreshes_counted("reused"), refreshes_counted("ended")

    with ended_sessions(app) as announced:
        refused = refresh(client, phone["refresh_token"])

    assert refused.status_code == 401
    assert refused.get_json() == {"error": {"code": "refresh_token_reused", "message": ENDED}}
    assert refused.headers["Cache-Control"] == "no-store"
    assert announced == []  # the family was not ended a second time
    assert refreshes_counted("reused") == reused_before  # no reuse detection in the metrics
    assert refreshes_counted("ended") == ended_before + 1
    assert refresh(client, phone["refresh_token"]).get_json()["error"]["message"] == ENDED  # and stays so


def test_reuse_while_the_session_lives_keeps_its_message_and_ends_the_session(app, client, auth, rdb):
    tokens = auth.new_user_tokens()
    rotated = refresh(client, tokens["refresh_token"]).get_json()
    reused_before = refreshes_counted("reused")

    with ended_sessions(app) as announced:
        replay = refresh(client, tokens["refresh_token"])

    assert replay.status_code == 401
    assert replay.get_json() == {"error": {"code": "refresh_token_reused", "message": REUSED}}
    assert announced == [tokens["session_id"]]  # live connections of the session are closed
    assert refreshes_counted("reused") == reused_before + 1
    assert not rdb.exists(Keys.session(tokens["user"]["id"], tokens["session_id"]))
    assert client.get("/auth/me", headers=bearer(rotated["access_token"])).status_code == 401
    # The newest token of the session it ended is refused as an ended session's.
    assert refresh(client, rotated["refresh_token"]).get_json()["error"]["message"] == ENDED


def test_with_cookies_an_ended_sessions_refresh_says_so_and_clears_them(app, client, auth):
    user = auth.register()
    assert auth.login(user["email"], transport="cookie").status_code == 200  # this browser
    laptop = https_client(app)  # another device, with its own cookie jar
    tokens = AuthActions(laptop).login_body(user["email"], device="laptop")
    assert laptop.post("/auth/logout-all", headers=bearer(tokens["access_token"])).status_code == 204

    refused = client.post("/auth/refresh")

    assert refused.status_code == 401
    assert refused.get_json() == {"error": {"code": "refresh_token_reused", "message": ENDED}}
    cleared = parse_set_cookies(refused.headers.getlist("Set-Cookie"))
    assert cleared["__Host-access"]["max-age"] == cleared["__Secure-refresh"]["max-age"] == "0"
