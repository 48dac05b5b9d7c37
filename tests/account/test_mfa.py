"""TOTP MFA: setup, confirmation with recovery codes, the two-step login, and every way a code or an
mfa_token can be wrong. Codes are computed here from the secret, for the time steps each test needs."""

from __future__ import annotations

import hashlib
import hmac
import time

import pyotp
import pytest

from app.auth import mailtokens
from app.redis import Keys
from tests.conftest import TEST_SECRET_KEY, https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer

STEP = 30


def recovery_hash(code: str) -> str:
    """HMAC-SHA256 of the code under a key derived from the test SECRET_KEY."""
    key = hashlib.sha256(b"recovery-code:" + TEST_SECRET_KEY.encode()).digest()
    return hmac.new(key, code.replace("-", "").encode(), hashlib.sha256).hexdigest()


def queued_mails(rdb, kind: str, user_id: str) -> list[str]:
    """The ids of queued mail jobs of this kind for this user."""
    jobs = rdb.zrange(Keys.mail_queue(), 0, -1)
    return [job for job in jobs if rdb.hmget(Keys.mail_job(job), "kind", "user_id") == [kind, user_id]]


def settle(margin: float = 4.0) -> float:
    """Wait, if need be, until the current 30 s step has `margin` seconds left; returns now.

    Tests that use codes of neighbouring steps must not straddle a step boundary while they run.
    """
    left = STEP - time.time() % STEP
    if left < margin:
        time.sleep(left + 0.05)
    return time.time()


def code_at(secret: str, offset_steps: int = 0) -> str:
    return pyotp.TOTP(secret).at(time.time() + offset_steps * STEP)


def set_up_mfa(client, access_token: str) -> tuple[str, list[str]]:
    """Turn MFA on for the user; (secret, recovery codes)."""
    setup = client.post("/auth/mfa/totp/setup", headers=bearer(access_token))
    assert setup.status_code == 200
    secret = setup.get_json()["secret"]
    confirm = client.post("/auth/mfa/totp/confirm", json={"code": code_at(secret)}, headers=bearer(access_token))
    assert confirm.status_code == 200, confirm.get_json()
    return secret, confirm.get_json()["recovery_codes"]


def first_step(client, email: str, transport: str = "body") -> str:
    answer = client.post("/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": transport})
    assert answer.status_code == 401 and answer.get_json()["error"]["code"] == "mfa_required"
    assert answer.headers["Cache-Control"] == "no-store"
    return answer.get_json()["mfa_token"]


def second_step(client, mfa_token: str, **factor):
    return client.post("/auth/login/mfa", json={"mfa_token": mfa_token, "transport": "body", **factor})


def test_setup_returns_a_secret_uri_and_qr_code_and_mfa_is_on_only_after_confirmation(client, auth, rdb):
    settle()
    tokens = auth.new_user_tokens()
    setup = client.post("/auth/mfa/totp/setup", headers=bearer(tokens["access_token"]))
    assert setup.status_code == 200 and setup.headers["Cache-Control"] == "no-store"
    body = setup.get_json()
    assert len(body["secret"]) == 32  # base32: 160 bits
    parsed = pyotp.parse_uri(body["otpauth_uri"])
    assert parsed.secret == body["secret"] and parsed.name == tokens["email"] and parsed.interval == 30
    assert body["qr_svg"].startswith("<svg") and "<script" not in body["qr_svg"]
    # Not on yet: a password login still finishes in one step.
    assert auth.login(tokens["email"]).status_code == 200
    me = client.get("/auth/me", headers=bearer(tokens["access_token"])).get_json()["user"]
    assert me["mfa_enabled"] is False

    wrong = client.post("/auth/mfa/totp/confirm", json={"code": "000000"}, headers=bearer(tokens["access_token"]))
    assert wrong.status_code == 401 and wrong.get_json()["error"]["code"] == "invalid_mfa_code"
    confirm = client.post(
        "/auth/mfa/totp/confirm", json={"code": code_at(body["secret"])}, headers=bearer(tokens["access_token"])
    )
    assert confirm.status_code == 200 and confirm.headers["Cache-Control"] == "no-store"
    codes = confirm.get_json()["recovery_codes"]
    assert len(codes) == 10 and len(set(codes)) == 10
    # Stored under a keyed hash: neither the codes nor their plain SHA-256 (which a copy of the database
    # alone would let anyone test 50-bit guesses against) are in Redis.
    stored = rdb.smembers(Keys.user_recovery_codes(tokens["user"]["id"]))
    assert stored == {recovery_hash(c) for c in codes}
    assert not stored & {hashlib.sha256(c.replace("-", "").encode()).hexdigest() for c in codes}
    me = client.get("/auth/me", headers=bearer(tokens["access_token"])).get_json()["user"]
    assert me["mfa_enabled"] is True
    again = client.post("/auth/mfa/totp/setup", headers=bearer(tokens["access_token"]))
    assert again.status_code == 409  # turn it off first


def test_login_takes_two_steps_and_the_code_is_accepted_once(client, auth, mfa_user):
    first = first_step(client, mfa_user["email"])
    # The code that confirmed the setup was used already: a later step's code is needed, and the answer
    # says so rather than calling a right code wrong.
    used = second_step(client, first, code=code_at(mfa_user["secret"]))
    assert used.status_code == 401 and used.get_json()["error"]["code"] == "invalid_mfa_code"
    assert "used already" in used.get_json()["error"]["message"]
    done = second_step(client, first, code=code_at(mfa_user["secret"], +1), device="phone")
    assert done.status_code == 200 and done.headers["Cache-Control"] == "no-store"
    assert done.get_json()["user"]["mfa_enabled"] is True
    assert client.get("/auth/me", headers=bearer(done.get_json()["access_token"])).status_code == 200
    sessions = client.get("/auth/sessions", headers=bearer(done.get_json()["access_token"])).get_json()["sessions"]
    assert any(s["device"] == "phone" for s in sessions)
    # The same code again, with a fresh mfa_token: refused (a code is accepted once).
    second = first_step(client, mfa_user["email"])
    reused = second_step(client, second, code=code_at(mfa_user["secret"], +1))
    assert reused.status_code == 401 and reused.get_json()["error"]["code"] == "invalid_mfa_code"
    # The first mfa_token finished its login: it is used up.
    spent = second_step(client, first, code=code_at(mfa_user["secret"], +1))
    assert spent.status_code == 400 and spent.get_json()["error"]["code"] == "invalid_token"


def test_a_recovery_code_logs_in_once(client, auth, mfa_user):
    code = mfa_user["recovery_codes"][3]
    token = first_step(client, mfa_user["email"])
    assert second_step(client, token, recovery_code=code.upper().replace("-", " ")).status_code == 200
    token = first_step(client, mfa_user["email"])
    again = second_step(client, token, recovery_code=code)
    assert again.status_code == 401 and again.get_json()["error"]["code"] == "invalid_mfa_code"
    assert second_step(client, token, recovery_code=mfa_user["recovery_codes"][4]).status_code == 200


def test_codes_one_step_off_are_accepted_two_steps_off_are_not(client, auth):
    settle()
    tokens = auth.new_user_tokens()
    setup = client.post("/auth/mfa/totp/setup", headers=bearer(tokens["access_token"])).get_json()
    secret = setup["secret"]
    for offset in (+2, -2):
        answer = client.post(
            "/auth/mfa/totp/confirm", json={"code": code_at(secret, offset)}, headers=bearer(tokens["access_token"])
        )
        assert answer.status_code == 401, offset
    assert (
        client.post(
            "/auth/mfa/totp/confirm", json={"code": code_at(secret, -1)}, headers=bearer(tokens["access_token"])
        ).status_code
        == 200
    )  # a phone whose clock is one step behind
    token = first_step(client, tokens["email"])
    assert second_step(client, token, code=code_at(secret, +1)).status_code == 200  # one step ahead


@pytest.mark.parametrize("bad", ["", "12345", "1234567", "abcdef", "12345\u0000", "٣٤٥٦٧٨", "x" * 5000])
def test_malformed_codes_are_wrong_codes(client, mfa_user, bad):
    token = first_step(client, mfa_user["email"])
    answer = second_step(client, token, code=bad)
    assert answer.status_code == 401 and answer.get_json()["error"]["code"] == "invalid_mfa_code"


def test_wrongly_typed_or_missing_fields_are_400(client, mfa_user):
    token = first_step(client, mfa_user["email"])
    for body in ({"mfa_token": token, "code": 123456}, {"mfa_token": token}, {"code": "123456"}, {"mfa_token": 5}):
        answer = client.post("/auth/login/mfa", json=body)
        assert answer.status_code == 400 and answer.get_json()["error"]["code"] == "bad_request", body
    # None of it counted as a guess: the token still works.
    assert second_step(client, token, code=code_at(mfa_user["secret"], +1)).status_code == 200


def test_an_mfa_token_dies_after_five_wrong_codes(client, mfa_user):
    token = first_step(client, mfa_user["email"])
    for _ in range(5):
        assert second_step(client, token, code="000000").get_json()["error"]["code"] == "invalid_mfa_code"
    right = second_step(client, token, code=code_at(mfa_user["secret"], +1))
    assert right.status_code == 400 and right.get_json()["error"]["code"] == "invalid_token"
    # A new login (the password again) gets a new token.
    fresh = first_step(client, mfa_user["email"])
    assert second_step(client, fresh, code=code_at(mfa_user["secret"], +1)).status_code == 200


def test_an_mfa_token_lives_five_minutes(client, mfa_user, rdb):
    token = first_step(client, mfa_user["email"])
    key = Keys.mfa_login(mfa_user["user"]["id"], hashlib.sha256(token.encode()).hexdigest())
    assert 290 <= rdb.ttl(key) <= 300
    assert token not in repr(rdb.hgetall(key))  # stored hashed
    rdb.pexpire(key, 1)  # five minutes later
    while rdb.exists(key):
        time.sleep(0.001)
    late = second_step(client, token, code=code_at(mfa_user["secret"], +1))
    assert late.status_code == 400 and late.get_json()["error"]["code"] == "invalid_token"


def test_unknown_mfa_tokens_and_a_logout_everywhere_in_between(client, auth, mfa_user):
    assert second_step(client, "not-a-token", code="123456").get_json()["error"]["code"] == "invalid_token"
    token = first_step(client, mfa_user["email"])
    assert client.post("/auth/logout-all", headers=bearer(mfa_user["access_token"])).status_code == 204
    stale = second_step(client, token, code=code_at(mfa_user["secret"], +1))
    assert stale.get_json()["error"]["code"] == "invalid_token"  # the account's sessions ended meanwhile


def test_wrong_password_stays_invalid_credentials_without_an_mfa_token(client, auth, mfa_user):
    answer = auth.login(mfa_user["email"], "wrong password!")
    assert answer.status_code == 401 and answer.get_json()["error"]["code"] == "invalid_credentials"
    assert "mfa_token" not in answer.get_json()


def test_cookie_transport_sets_cookies_only_after_the_second_step(client, mfa_user):
    answer = client.post("/auth/login", json={"email": mfa_user["email"], "password": DEFAULT_PASSWORD})
    assert answer.status_code == 401 and answer.headers.getlist("Set-Cookie") == []
    token = answer.get_json()["mfa_token"]
    done = client.post("/auth/login/mfa", json={"mfa_token": token, "code": code_at(mfa_user["secret"], +1)})
    assert done.status_code == 200 and "access_token" not in done.get_json()
    cookies = done.headers.getlist("Set-Cookie")
    assert any(c.startswith("__Host-access=") for c in cookies) and any(
        c.startswith("__Secure-refresh=") for c in cookies
    )


def test_disabling_needs_the_password_and_a_code(client, auth, mfa_user):
    headers = bearer(mfa_user["access_token"])
    wrong_password = client.delete(
        "/auth/mfa/totp", json={"password": "nope nope nope", "code": code_at(mfa_user["secret"], +1)}, headers=headers
    )
    assert wrong_password.status_code == 401 and wrong_password.get_json()["error"]["code"] == "invalid_credentials"
    wrong_code = client.delete("/auth/mfa/totp", json={"password": DEFAULT_PASSWORD, "code": "000000"}, headers=headers)
    assert wrong_code.status_code == 401 and wrong_code.get_json()["error"]["code"] == "invalid_mfa_code"
    missing = client.delete("/auth/mfa/totp", json={"password": DEFAULT_PASSWORD}, headers=headers)
    assert missing.status_code == 400
    off = client.delete(
        "/auth/mfa/totp", json={"password": DEFAULT_PASSWORD, "code": code_at(mfa_user["secret"], +1)}, headers=headers
    )
    assert off.status_code == 204
    assert auth.login(mfa_user["email"]).status_code == 200  # one step again
    assert (
        client.delete("/auth/mfa/totp", json={"password": DEFAULT_PASSWORD, "code": "1"}, headers=headers).status_code
        == 409
    )


def test_a_recovery_code_can_turn_mfa_off(client, auth, mfa_user):
    headers = bearer(mfa_user["access_token"])
    body = {"password": DEFAULT_PASSWORD, "recovery_code": mfa_user["recovery_codes"][0]}
    assert client.delete("/auth/mfa/totp", json=body, headers=headers).status_code == 204
    assert client.get("/auth/me", headers=headers).get_json()["user"]["mfa_enabled"] is False


def test_mfa_guesses_are_rate_limited_per_mfa_token_and_per_account(make_app, auth):
    app = make_app(RATE_LIMITS_ENABLED="true", RATE_LIMIT_PASSWORD="3/minute", RATE_LIMIT_LOGIN="100/minute")
    client = https_client(app)
    helper = AuthActions(client)
    settle()
    tokens = helper.new_user_tokens()
    secret, _ = set_up_mfa(client, tokens["access_token"])
    token = first_step(client, tokens["email"])
    statuses = [
        client.post(
            "/auth/login/mfa", json={"mfa_token": token, "code": "000000"}, environ_base={"REMOTE_ADDR": f"10.0.0.{i}"}
        ).status_code
        for i in range(4)
    ]
    assert statuses == [401, 401, 401, 429]  # per mfa_token (and per account), whatever the address
    fresh = first_step(client, tokens["email"])
    limited = client.post(
        "/auth/login/mfa",
        json={"mfa_token": fresh, "code": code_at(secret, +1)},
        environ_base={"REMOTE_ADDR": "10.0.1.1"},
    )
    assert limited.status_code == 429 and "Retry-After" in limited.headers  # per account, across mfa_tokens


def age_login(rdb, tokens: dict, seconds: float) -> None:
    """Make the session's last proof of a factor `seconds` older (what time passing would do)."""
    key = Keys.session(tokens["user"]["id"], tokens["session_id"])
    rdb.hset(key, "authenticated_at", f"{float(rdb.hget(key, 'authenticated_at')) - seconds:.3f}")


def test_setting_up_mfa_needs_a_recent_authentication_not_just_an_access_token(client, auth, rdb):
    tokens = auth.new_user_tokens()
    headers = bearer(tokens["access_token"])
    age_login(rdb, tokens, 6 * 60)  # a token stolen from a session logged in six minutes ago
    refused = client.post("/auth/mfa/totp/setup", headers=headers)
    assert refused.status_code == 403 and refused.get_json()["error"]["code"] == "reauthentication_required"
    assert not rdb.hget(Keys.user(tokens["user"]["id"]), "totp_pending")
    # A refresh does not renew it: only proving a factor again does.
    refreshed = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]}).get_json()
    assert client.post("/auth/mfa/totp/setup", headers=bearer(refreshed["access_token"])).status_code == 403
    wrong = client.post("/auth/reauthenticate", json={"password": "not the password"}, headers=headers)
    assert wrong.status_code == 401 and wrong.get_json()["error"]["code"] == "invalid_credentials"
    assert client.get("/auth/me", headers=headers).status_code == 200  # the session goes on
    assert client.post("/auth/mfa/totp/setup", headers=headers).status_code == 403
    for bad in ({}, {"password": 5}, {"login_id": "x"}):
        assert client.post("/auth/reauthenticate", json=bad, headers=headers).status_code == 400
    assert client.post("/auth/reauthenticate", json={"password": DEFAULT_PASSWORD}).status_code == 401
    again = client.post("/auth/reauthenticate", json={"password": DEFAULT_PASSWORD}, headers=headers)
    assert again.status_code == 204
    assert client.post("/auth/mfa/totp/setup", headers=headers).status_code == 200
    age_login(rdb, tokens, 6 * 60)
    assert client.post("/auth/mfa/totp/setup", headers=headers).status_code == 403


def test_turning_mfa_on_mails_the_owner(client, auth, rdb):
    settle()
    tokens = auth.new_user_tokens()
    assert queued_mails(rdb, "mfa_enabled", tokens["user"]["id"]) == []
    set_up_mfa(client, tokens["access_token"])
    assert len(queued_mails(rdb, "mfa_enabled", tokens["user"]["id"])) == 1


def test_too_many_wrong_codes_in_a_row_lock_mfa_login_until_a_password_reset(make_app):
    app = make_app(MFA_MAX_FAILURES="7", RATE_LIMITS_ENABLED="true", RATE_LIMIT_PASSWORD="1000/minute")
    client, rdb = https_client(app), app.extensions["redis"]
    settle()
    tokens = AuthActions(client).new_user_tokens()
    user_id = tokens["user"]["id"]
    secret, codes = set_up_mfa(client, tokens["access_token"])
    # A right code between wrong ones starts the count again: it counts wrong codes in a row.
    token = first_step(client, tokens["email"])
    for _ in range(4):
        assert second_step(client, token, code="000000").status_code == 401
    assert second_step(client, token, recovery_code=codes[0]).status_code == 200
    wrong = 0
    while wrong < 7:  # over several mfa_tokens: each dies after five wrong codes
        token = first_step(client, tokens["email"])
        for _ in range(min(5, 7 - wrong)):
            answer = second_step(client, token, code="000000")
            assert answer.status_code == 401 and answer.get_json()["error"]["code"] == "invalid_mfa_code"
            wrong += 1
    assert len(queued_mails(rdb, "mfa_locked", user_id)) == 1
    token = first_step(client, tokens["email"])  # the password step still answers mfa_required
    for factor in ({"code": code_at(secret, +1)}, {"recovery_code": codes[1]}, {"code": "000000"}):
        locked = second_step(client, token, **factor)
        assert locked.status_code == 429 and locked.get_json()["error"]["code"] == "mfa_locked", factor
        assert "Retry-After" not in locked.headers  # waiting does not unlock it
    assert len(queued_mails(rdb, "mfa_locked", user_id)) == 1  # mailed once, when it locked

    with app.app_context():
        reset_token = mailtokens.issue_token(user_id, tokens["email"], mailtokens.RESET)
    reset = client.post("/auth/password/reset", json={"token": reset_token, "new_password": DEFAULT_PASSWORD + "!"})
    assert reset.status_code == 204
    answer = client.post("/auth/login", json={"email": tokens["email"], "password": DEFAULT_PASSWORD + "!"})
    token = answer.get_json()["mfa_token"]
    assert second_step(client, token, code=code_at(secret, +1)).status_code == 200
