"""Known devices (app/auth/devices.py): guesses at an account's password never lock out a client that has
logged in to it before, by device cookie or by `device_token`; a password reset, "log out everywhere" or a
deleted account retires those credentials, as it does sessions."""

from __future__ import annotations

import logging

import pytest

from app.auth.devices import DEVICE_COOKIE
from app.auth.users import create_user
from app.mail import messages
from app.redis import Keys
from tests.account.test_mfa import set_up_mfa
from tests.conftest import https_client
from tests.mailserver import Received
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, random_email

NEW_PASSWORD = "a brand new passphrase"


def login(client, email, address, password=DEFAULT_PASSWORD, transport="body", **extra):
    body = {"email": email, "password": password, "transport": transport, **extra}
    return client.post("/auth/login", json=body, headers={"X-Forwarded-For": address})


@pytest.fixture
def app(make_app):
    return make_app(RATE_LIMITS_ENABLED="true", RATE_LIMIT_LOGIN="3/minute")


def lock_out(app, email: str) -> None:
    """Guess at the account from fresh addresses until its bucket is full: then even the right password,
    from anywhere, is refused to a client that cannot show it has logged in before."""
    attacker = https_client(app)
    guesses = [login(attacker, email, f"198.51.100.{n}", password=f"guess-{n}-password").status_code for n in range(4)]
    assert guesses[-1] == 429, guesses
    assert login(attacker, email, "198.51.100.99", password=DEFAULT_PASSWORD).status_code == 429
    assert login(attacker, email, "198.51.100.98", password=NEW_PASSWORD).status_code == 429


def test_an_app_that_logged_in_before_is_not_locked_out_by_guesses_at_its_account(app, client, auth):
    user = auth.register()
    first = login(client, user["email"], "192.0.2.1")
    assert first.status_code == 200
    token = first.get_json().get("device_token")
    assert isinstance(token, str) and token, first.get_json()
    lock_out(app, user["email"])
    again = login(client, user["email"], "192.0.2.1", device_token=token)
    assert again.status_code == 200, again.get_json()
    assert again.get_json()["device_token"] == token  # kept: the device stays the same device
    assert again.headers["Cache-Control"] == "no-store"
    # Its own bucket has the same limit: a stolen device_token buys no extra guesses.
    wrong = [login(client, user["email"], f"192.0.2.{n}", "wrong-password", device_token=token) for n in (7, 8, 9)]
    assert [answer.status_code for answer in wrong] == [401, 401, 429]


def test_a_device_token_counts_only_for_its_own_account_and_only_as_a_device_token(app, client, auth):
    user, other = auth.register(), auth.register()
    token = login(client, user["email"], "192.0.2.1").get_json()["device_token"]
    browser = https_client(app)
    assert login(browser, other["email"], "192.0.2.2", transport="cookie").status_code == 200
    cookie = browser.get_cookie(DEVICE_COOKIE, path="/auth/login").value
    lock_out(app, other["email"])
    for presented in (token, cookie, token[:-2] + ("AA" if not token.endswith("AA") else "BB"), "x" * 40):
        assert login(client, other["email"], "192.0.2.1", device_token=presented).status_code == 429
    # A device_token is no access token either.
    assert client.get("/auth/me", headers=bearer(token)).status_code == 401


def test_a_login_without_a_usable_device_token_gets_a_new_one(make_app):
    client = https_client(make_app(RATE_LIMITS_ENABLED="true", RATE_LIMIT_LOGIN="20/minute"))
    user = AuthActions(client).register()
    token = login(client, user["email"], "192.0.2.1").get_json()["device_token"]
    other = login(client, user["email"], "192.0.2.1", device_token="not-a-device-token").get_json()["device_token"]
    assert other and other != token
    assert "device_token" not in login(client, user["email"], "192.0.2.1", transport="cookie").get_json()
    refresh_token = login(client, user["email"], "192.0.2.1").get_json()["refresh_token"]
    refreshed = client.post("/auth/refresh", json={"refresh_token": refresh_token})
    assert refreshed.status_code == 200 and "device_token" not in refreshed.get_json()  # a login's answer only
    too_long = login(client, user["email"], "192.0.2.1", device_token="x" * 513)
    assert too_long.status_code == 422 and "x" * 513 not in too_long.get_data(as_text=True)
    assert login(client, user["email"], "192.0.2.1", device_token=7).status_code == 400


def test_device_tokens_are_never_logged(client, auth, caplog):
    user = auth.register()
    access_log = logging.getLogger("access")  # the request log does not propagate: listen to it too
    access_log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.DEBUG):
            first = login(client, user["email"], "192.0.2.1")
            token = first.get_json()["device_token"]
            again = login(client, user["email"], "192.0.2.2", device_token=token)
            assert again.status_code == 200
            for answer in (first, again):
                answer.close()  # the request line is written when the answer is done with
    finally:
        access_log.removeHandler(caplog.handler)
    assert [record.name for record in caplog.records].count("access") == 2
    assert token not in caplog.text


def test_the_mfa_step_makes_a_known_device_too(app, client, auth):
    tokens = auth.new_user_tokens()
    email = tokens["email"]
    _, recovery_codes = set_up_mfa(client, tokens["access_token"])
    first = login(client, email, "192.0.2.1")
    assert first.get_json()["error"]["code"] == "mfa_required"
    body = {"mfa_token": first.get_json()["mfa_token"], "recovery_code": recovery_codes[0], "transport": "body"}
    done = client.post("/auth/login/mfa", json=body)
    assert done.status_code == 200
    token = done.get_json().get("device_token")
    assert isinstance(token, str) and token, done.get_json()
    lock_out(app, email)
    again = login(client, email, "192.0.2.1", device_token=token)
    assert again.status_code == 401 and again.get_json()["error"]["code"] == "mfa_required"
    body = {"mfa_token": again.get_json()["mfa_token"], "recovery_code": recovery_codes[1], "transport": "body"}
    finished = client.post("/auth/login/mfa", json={**body, "device_token": token})
    assert finished.status_code == 200 and finished.get_json()["device_token"] == token


def reset_password(app, rdb, client, owner: dict) -> None:
    """Ask for a reset link and use the token the mail carries (the message the sender would send)."""
    email = owner["user"]["email"]
    assert client.post("/auth/password/forgot", json={"email": email}).status_code == 202
    jobs = [rdb.hgetall(Keys.mail_job(job_id)) for job_id in rdb.zrange(Keys.mail_queue(), 0, -1)]
    (job,) = [job for job in jobs if job.get("kind") == messages.PASSWORD_RESET and job.get("email") == email]
    with app.app_context():
        token = Received("", [], messages.build(job)).token()
    assert client.post("/auth/password/reset", json={"token": token, "new_password": NEW_PASSWORD}).status_code == 204


def log_out_everywhere(app, rdb, client, owner: dict) -> None:
    assert client.post("/auth/logout-all", headers=bearer(owner["access_token"])).status_code == 204


def delete_and_register_again(app, rdb, client, owner: dict) -> None:
    admin_email = random_email()
    with app.app_context():
        create_user(admin_email, DEFAULT_PASSWORD, role="admin", email_verified=True)
    admin = AuthActions(client).login_body(admin_email)
    answer = client.delete(f"/admin/users/{owner['user']['id']}", headers=bearer(admin["access_token"]))
    assert answer.status_code == 204
    AuthActions(client).register(owner["user"]["email"], NEW_PASSWORD)


@pytest.mark.parametrize("credential", ["device_cookie", "device_token"])
@pytest.mark.parametrize(
    "retire", [reset_password, log_out_everywhere, delete_and_register_again], ids=lambda retire: retire.__name__
)
def test_old_device_credentials_stop_counting_once_the_account_retires_its_sessions(app, auth, rdb, retire, credential):
    email = auth.register()["email"]
    device = https_client(app)
    transport = "cookie" if credential == "device_cookie" else "body"
    owner = login(device, email, "192.0.2.1", transport="body").get_json()
    assert login(device, email, "192.0.2.2", transport="cookie").status_code == 200
    assert device.get_cookie(DEVICE_COOKIE, path="/auth/login") is not None
    if credential == "device_token":
        device.delete_cookie(DEVICE_COOKIE, path="/auth/login")  # the app keeps its device_token only
        assert device.get_cookie(DEVICE_COOKIE, path="/auth/login") is None
    old = {"device_token": owner["device_token"]} if credential == "device_token" else {}
    retire(app, rdb, https_client(app), owner)
    lock_out(app, email)
    for password in (DEFAULT_PASSWORD, NEW_PASSWORD):  # whichever the account has now
        assert login(device, email, "192.0.2.1", password, transport, **old).status_code == 429


def test_the_browser_that_resets_the_password_is_a_known_device_from_then_on(app, auth, rdb):
    """Whoever resets holds the mailbox: a spray going on must not keep the recovering owner out."""
    email = auth.register()["email"]
    owner = https_client(app)
    reset_password(app, rdb, owner, {"user": {"email": email}})
    assert owner.get_cookie(DEVICE_COOKIE, path="/auth/login") is not None
    lock_out(app, email)
    assert login(owner, email, "192.0.2.1", NEW_PASSWORD, transport="cookie").status_code == 200
