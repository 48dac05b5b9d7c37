"""Passkeys (WebAuthn): registration, login and re-authentication against a software authenticator
(tests/webauthn_authenticator.py), and every refusal of docs/api.md's Passkeys section, one at a time.

The test client speaks as https://localhost, so the RP ID is `localhost` and the origin
`https://localhost` (the defaults: the request's host and origin).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pyotp
import pytest

from app.auth import mailtokens, passkeys, users
from app.metrics import LOGINS
from app.redis import Keys
from app.settings import SettingsError, load_settings
from tests.account.test_mfa import queued_mails
from tests.conftest import https_client
from tests.utils import DEFAULT_PASSWORD, AuthActions, bearer, parse_set_cookies, redis_snapshot
from tests.webauthn_authenticator import RS256, Authenticator, b64url, from_b64url

ORIGIN, RP_ID = "https://localhost", "localhost"


def authenticator(**options) -> Authenticator:
    return Authenticator(origin=ORIGIN, rp_id=RP_ID, **options)


def creation_options(client, token: str) -> dict:
    answer = client.post("/auth/passkeys/register/options", headers=bearer(token))
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()["options"]


def add_passkey(client, token: str, device: Authenticator, name: str | None = None, **create):
    """Ask for options, let the authenticator answer them, send the answer: the response."""
    body = {"credential": device.create(creation_options(client, token), **create)}
    if name is not None:
        body["name"] = name
    return client.post("/auth/passkeys", json=body, headers=bearer(token))


def request_options(client, **body) -> tuple[dict, str]:
    answer = client.post("/auth/passkeys/login/options", json=body)
    assert answer.status_code == 200, answer.get_json()
    return answer.get_json()["options"], answer.get_json()["login_id"]


def passkey_login(client, device: Authenticator, transport: str = "body", device_name: str | None = None, **get):
    options, login_id = request_options(client)
    body = {"login_id": login_id, "credential": device.get(options, **get), "transport": transport}
    if device_name is not None:
        body["device"] = device_name
    return client.post("/auth/passkeys/login", json=body)


def refused(response, status: int = 401, code: str = "invalid_credentials") -> bool:
    return response.status_code == status and response.get_json()["error"]["code"] == code


def age_login(rdb, tokens: dict, seconds: float) -> None:
    """Make the session's last proof of a factor `seconds` older (what time passing would do)."""
    key = Keys.session(tokens["user"]["id"], tokens["session_id"])
    rdb.hset(key, "authenticated_at", f"{float(rdb.hget(key, 'authenticated_at')) - seconds:.3f}")


def wait_until_gone(rdb, key: str) -> None:
    """Let a key expire in Redis (now), then wait until Redis no longer has it."""
    rdb.pexpire(key, 1)
    deadline = time.monotonic() + 5
    while rdb.exists(key):
        assert time.monotonic() < deadline, f"{key} did not expire"
        time.sleep(0.01)


@pytest.fixture
def owner(client, auth):
    """A user with one passkey (a counting ES256 authenticator), logged in with the body transport."""
    tokens = auth.new_user_tokens()
    device = authenticator()
    added = add_passkey(client, tokens["access_token"], device)
    assert added.status_code == 201, added.get_json()
    return {**tokens, "device": device, "passkey": added.get_json()}


# Registration.


def test_registration_options_follow_the_contract(client, auth, rdb):
    tokens = auth.new_user_tokens()
    options = creation_options(client, tokens["access_token"])
    assert options["rp"] == {"id": RP_ID, "name": "auth-rt"}
    assert options["authenticatorSelection"]["residentKey"] == "required"
    assert options["authenticatorSelection"]["userVerification"] == "required"
    assert [p["alg"] for p in options["pubKeyCredParams"]] == [-7, -257]  # ES256, RS256
    assert len(from_b64url(options["challenge"])) >= 16
    assert options["excludeCredentials"] == [] and options["attestation"] == "none"
    assert options["user"]["name"] == tokens["email"]
    # The user handle: random (it is not the user id), kept once, the same in every later option.
    handle = options["user"]["id"]
    assert len(from_b64url(handle)) == 32 and tokens["user"]["id"] not in (handle, from_b64url(handle).hex())
    device = authenticator()
    assert add_passkey(client, tokens["access_token"], device).status_code == 201
    again = creation_options(client, tokens["access_token"])
    assert again["user"]["id"] == handle and again["challenge"] != options["challenge"]
    assert again["excludeCredentials"] == [
        {"id": device.credentials[0].id_text, "type": "public-key", "transports": ["internal", "hybrid"]}
    ]


def test_a_passkey_is_registered_listed_renamed_and_removed(client, auth, rdb):
    tokens = auth.new_user_tokens()
    token = tokens["access_token"]
    device = authenticator()
    added = add_passkey(client, token, device)
    assert added.status_code == 201
    passkey = added.get_json()
    today = datetime.now(UTC).date().isoformat()
    assert passkey == {
        "id": device.credentials[0].id_text,
        "name": f"Passkey {today}",
        "created_at": passkey["created_at"],
        "last_used_at": None,
    }
    assert passkey["created_at"].startswith(today) and passkey["created_at"].endswith("Z")
    named = add_passkey(client, token, authenticator(algorithm=RS256), name="  Work laptop  ")
    assert named.status_code == 201 and named.get_json()["name"] == "Work laptop"
    listed = client.get("/auth/passkeys", headers=bearer(token)).get_json()["passkeys"]
    assert [p["id"] for p in listed] == [passkey["id"], named.get_json()["id"]]
    assert rdb.get(Keys.user_by_passkey(passkey["id"])) == tokens["user"]["id"]
    assert len(queued_mails(rdb, "passkey_added", tokens["user"]["id"])) == 2  # its owner hears of each

    renamed = client.patch(f"/auth/passkeys/{passkey['id']}", json={"name": "Phone"}, headers=bearer(token))
    assert renamed.status_code == 200 and renamed.get_json() == {**passkey, "name": "Phone"}
    assert client.get("/auth/passkeys", headers=bearer(token)).get_json()["passkeys"][0]["name"] == "Phone"

    assert client.delete(f"/auth/passkeys/{passkey['id']}", headers=bearer(token)).status_code == 204
    assert [p["id"] for p in client.get("/auth/passkeys", headers=bearer(token)).get_json()["passkeys"]] == [
        named.get_json()["id"]
    ]
    assert not rdb.exists(Keys.user_by_passkey(passkey["id"]))  # the credential id is free again
    assert refused(passkey_login(client, device))
    assert client.delete(f"/auth/passkeys/{passkey['id']}", headers=bearer(token)).status_code == 404


def test_registering_needs_a_login_and_a_recent_authentication(client, auth, rdb):
    assert client.post("/auth/passkeys/register/options").status_code == 401
    assert client.post("/auth/passkeys", json={"credential": {}}).status_code == 401
    assert client.get("/auth/passkeys").status_code == 401
    tokens = auth.new_user_tokens()
    headers = bearer(tokens["access_token"])
    age_login(rdb, tokens, 6 * 60)  # a token stolen from a session logged in six minutes ago
    answer = client.post("/auth/passkeys/register/options", headers=headers)
    assert refused(answer, 403, "reauthentication_required")
    assert not rdb.exists(Keys.passkey_registration(tokens["user"]["id"]))
    assert client.post("/auth/reauthenticate", json={"password": DEFAULT_PASSWORD}, headers=headers).status_code == 204
    assert add_passkey(client, tokens["access_token"], authenticator()).status_code == 201


@pytest.mark.parametrize(
    "wrong",
    [
        {"origin": "https://evil.example"},
        {"origin": "http://localhost"},
        {"rp_id": "evil.example"},
        {"user_verified": False},
        {"challenge": b64url(b"a challenge this service never gave")},
    ],
    ids=["origin", "scheme", "rp-id", "no-user-verification", "foreign-challenge"],
)
def test_a_refused_registration_is_422_and_uses_up_the_challenge(client, auth, rdb, wrong):
    tokens = auth.new_user_tokens()
    token = tokens["access_token"]
    device = authenticator()
    options = creation_options(client, token)
    answer = client.post("/auth/passkeys", json={"credential": device.create(options, **wrong)}, headers=bearer(token))
    assert refused(answer, 422, "validation_failed")
    assert not rdb.exists(Keys.user_passkeys(tokens["user"]["id"]))
    assert not rdb.exists(Keys.user_by_passkey(device.credentials[0].id_text))
    # The same options, answered rightly now: their challenge is gone.
    again = client.post("/auth/passkeys", json={"credential": device.create(options)}, headers=bearer(token))
    assert refused(again, 422, "validation_failed")


def test_a_registration_challenge_is_used_once_and_lives_five_minutes(client, auth, rdb):
    tokens = auth.new_user_tokens()
    token = tokens["access_token"]
    device = authenticator()
    options = creation_options(client, token)
    assert (
        client.post("/auth/passkeys", json={"credential": device.create(options)}, headers=bearer(token)).status_code
        == 201
    )
    reused = client.post("/auth/passkeys", json={"credential": device.create(options)}, headers=bearer(token))
    assert refused(reused, 422, "validation_failed")
    # Only the last options count: older ones were replaced.
    older, newer = creation_options(client, token), creation_options(client, token)
    stale = client.post("/auth/passkeys", json={"credential": device.create(older)}, headers=bearer(token))
    assert refused(stale, 422, "validation_failed")
    options = creation_options(client, token)
    assert newer["challenge"] != options["challenge"]
    wait_until_gone(rdb, Keys.passkey_registration(tokens["user"]["id"]))
    expired = client.post("/auth/passkeys", json={"credential": device.create(options)}, headers=bearer(token))
    assert refused(expired, 422, "validation_failed")
    assert len(client.get("/auth/passkeys", headers=bearer(token)).get_json()["passkeys"]) == 1


def test_a_registration_challenge_answers_only_the_session_that_asked(client, auth, rdb):
    """The options went to the session that proved a recent authentication: another session of the user (a
    token stolen long ago, say) can neither use the challenge nor use it up."""
    tokens = auth.new_user_tokens()
    other = auth.login_body(tokens["email"])
    device = authenticator()
    options = creation_options(client, tokens["access_token"])
    credential = device.create(options)
    elsewhere = client.post("/auth/passkeys", json={"credential": credential}, headers=bearer(other["access_token"]))
    assert refused(elsewhere, 422, "validation_failed")
    mine = client.post("/auth/passkeys", json={"credential": credential}, headers=bearer(tokens["access_token"]))
    assert mine.status_code == 201


def test_a_credential_id_belongs_to_one_account(client, auth, owner, rdb):
    """With "none" attestation anyone can present any credential id with a key of their own: a second
    registration of an id is refused, whoever tries it, and changes nothing."""
    taken = owner["device"].credentials[0].id
    other = auth.new_user_tokens()
    before = redis_snapshot(rdb)
    answer = add_passkey(client, other["access_token"], authenticator(), credential_id=taken)
    assert refused(answer, 409, "conflict")
    snapshot = redis_snapshot(rdb)
    changed = {k for k in snapshot.keys() | before.keys() if snapshot.get(k) != before.get(k)}
    assert all(k.startswith(f"user:{{{other['user']['id']}}}") for k in changed), changed  # its own options
    assert not rdb.exists(Keys.user_passkeys(other["user"]["id"]))
    assert rdb.get(Keys.user_by_passkey(b64url(taken))) == owner["user"]["id"]
    again = add_passkey(client, owner["access_token"], authenticator(), credential_id=taken)
    assert refused(again, 409, "conflict")  # the owner's own again: still one record, index kept
    assert rdb.get(Keys.user_by_passkey(b64url(taken))) == owner["user"]["id"]
    assert passkey_login(client, owner["device"]).status_code == 200


# Login.


def test_a_passkey_logs_in_with_the_body_transport(client, owner, rdb):
    successes = LOGINS.labels("success")._value.get()
    answer = passkey_login(client, owner["device"], device_name="My phone")
    assert answer.status_code == 200 and answer.headers["Cache-Control"] == "no-store"
    tokens = answer.get_json()
    assert tokens["user"]["id"] == owner["user"]["id"] and tokens["token_type"] == "Bearer"
    assert tokens["access_token"] and tokens["refresh_token"] and tokens["device_token"]
    assert LOGINS.labels("success")._value.get() == successes + 1
    me = client.get("/auth/me", headers=bearer(tokens["access_token"])).get_json()
    assert me["session_id"] == tokens["session_id"] != owner["session_id"]
    sessions = client.get("/auth/sessions", headers=bearer(tokens["access_token"])).get_json()["sessions"]
    assert {s["device"] for s in sessions} >= {"My phone"}
    refreshed = client.post("/auth/refresh", json={"refresh_token": tokens["refresh_token"]})
    assert refreshed.status_code == 200
    listed = client.get("/auth/passkeys", headers=bearer(tokens["access_token"])).get_json()["passkeys"]
    assert listed[0]["last_used_at"] is not None
    # A passkey login is a recent authentication: a passkey may be added at once.
    assert add_passkey(client, tokens["access_token"], authenticator()).status_code == 201


def test_a_passkey_logs_in_with_cookies_by_default(client, owner):
    options, login_id = request_options(client)
    body = {"login_id": login_id, "credential": owner["device"].get(options)}
    answer = client.post("/auth/passkeys/login", json=body, headers={"Origin": ORIGIN})
    assert answer.status_code == 200
    assert "access_token" not in answer.get_json() and "refresh_token" not in answer.get_json()
    cookies = parse_set_cookies(answer.headers.getlist("Set-Cookie"))
    assert cookies["__Host-access"]["httponly"] and cookies["__Host-access"]["samesite"] == "Strict"
    assert "__Secure-refresh" in cookies and "__Secure-device" in cookies
    assert client.get("/auth/me").get_json()["user"]["id"] == owner["user"]["id"]


def test_a_cross_site_page_cannot_log_a_browser_in_with_a_passkey(client, owner):
    options, login_id = request_options(client)
    body = {"login_id": login_id, "credential": owner["device"].get(options)}
    answer = client.post("/auth/passkeys/login", json=body, headers={"Origin": "https://evil.example"})
    assert refused(answer, 403, "csrf_rejected")


@pytest.mark.parametrize(
    "wrong",
    [
        {"origin": "https://evil.example"},
        {"origin": "https://localhost:8443"},
        {"rp_id": "evil.example"},
        {"user_verified": False},
        {"bad_signature": True},
        {"challenge": b64url(b"a challenge this service never gave")},
        {"user_handle": b""},
    ],
    ids=["origin", "port", "rp-id", "no-user-verification", "bad-signature", "unknown-challenge", "no-user-handle"],
)
def test_a_refused_login_is_401_and_changes_nothing(client, owner, rdb, wrong):
    failures = LOGINS.labels("failure")._value.get()
    before = redis_snapshot(rdb, ignore_prefixes=("ratelimit", "audit"))  # it is recorded, as a failed login
    answer = passkey_login(client, owner["device"], **wrong)
    assert refused(answer)
    assert "Set-Cookie" not in answer.headers
    after = redis_snapshot(rdb, ignore_prefixes=("ratelimit", "audit"))
    assert after == before  # the login_id itself is gone too: it was made and used up in between
    assert LOGINS.labels("failure")._value.get() == failures + 1
    assert passkey_login(client, owner["device"]).status_code == 200  # the counter did not move


def test_a_login_challenge_is_used_once_even_when_refused(client, owner):
    options, login_id = request_options(client)

    def answer(credential: dict):
        return client.post("/auth/passkeys/login", json={"login_id": login_id, "credential": credential})

    assert answer(owner["device"].get(options)).status_code == 200
    assert refused(answer(owner["device"].get(options)))  # a new assertion, even: the challenge is gone
    options, login_id = request_options(client)
    assert refused(answer(owner["device"].get(options, user_verified=False)))
    assert refused(answer(owner["device"].get(options)))


def test_a_foreign_challenge_is_refused(client, owner):
    """An answer to one login's options, sent with another login's id."""
    options, _ = request_options(client)
    _, other_login_id = request_options(client)
    body = {"login_id": other_login_id, "credential": owner["device"].get(options)}
    assert refused(client.post("/auth/passkeys/login", json=body))
    unknown = {"login_id": "no-such-login", "credential": owner["device"].get(options)}
    assert refused(client.post("/auth/passkeys/login", json=unknown))


def test_a_login_challenge_expires(client, owner, rdb):
    options, login_id = request_options(client)
    wait_until_gone(rdb, passkeys.login_challenge_key(login_id))
    body = {"login_id": login_id, "credential": owner["device"].get(options)}
    assert refused(client.post("/auth/passkeys/login", json=body))


def test_an_unknown_credential_is_refused(client, owner):
    stranger = authenticator()
    stranger.create(creation_options(client, owner["access_token"]))  # made, never registered
    assert refused(passkey_login(client, stranger))


def test_a_credential_of_one_user_with_the_user_handle_of_another_is_refused(client, auth, owner):
    other = auth.new_user_tokens()
    other_device = authenticator()
    assert add_passkey(client, other["access_token"], other_device).status_code == 201
    other_handle = other_device.credentials[0].user_handle
    assert refused(passkey_login(client, owner["device"], user_handle=other_handle))
    assert passkey_login(client, owner["device"]).status_code == 200


def test_a_counter_that_does_not_grow_is_refused(client, owner, rdb):
    device = owner["device"]
    assert passkey_login(client, device, counter=5).status_code == 200
    assert refused(passkey_login(client, device, counter=5))  # a clone, or a replayed assertion
    assert refused(passkey_login(client, device, counter=4))
    assert refused(passkey_login(client, device, counter=0))  # it counted before: 0 now is no reset
    assert passkey_login(client, device, counter=6).status_code == 200
    record = rdb.hget(Keys.user_passkeys(owner["user"]["id"]), device.credentials[0].id_text)
    assert '"sign_count":6' in record.replace(" ", "")


def test_an_authenticator_that_never_counts_logs_in_every_time(client, auth):
    tokens = auth.new_user_tokens()
    device = authenticator(counting=False, backup_eligible=True, backed_up=True)  # e.g. a synced passkey
    assert add_passkey(client, tokens["access_token"], device).status_code == 201
    assert [passkey_login(client, device).status_code for _ in range(3)] == [200, 200, 200]
    assert device.credentials[0].sign_count == 0


def test_two_logins_with_the_same_counter_at_once_only_one_passes(make_app, auth):
    """Both read the stored counter and both pass py_webauthn's check before either writes; the
    compare-and-set in Redis lets only one of them through."""
    app = make_app()
    actions = AuthActions(https_client(app))
    tokens = actions.new_user_tokens()
    device = authenticator()
    assert add_passkey(actions.client, tokens["access_token"], device).status_code == 201
    clients = [https_client(app), https_client(app)]
    bodies = []
    for browser in clients:
        options, login_id = request_options(browser)
        bodies.append({"login_id": login_id, "credential": device.get(options, counter=7)})
    both_verified = threading.Barrier(2, timeout=10)
    verify = passkeys.verify_authentication_response

    def verified_then_wait(**arguments):
        result = verify(**arguments)
        both_verified.wait()  # neither goes on to record the use before the other has verified
        return result

    passkeys.verify_authentication_response = verified_then_wait
    try:
        with ThreadPoolExecutor(2) as pool:
            sent = [
                pool.submit(one.post, "/auth/passkeys/login", json=body)
                for one, body in zip(clients, bodies, strict=True)
            ]
            answers = [future.result() for future in sent]
    finally:
        passkeys.verify_authentication_response = verify
    assert sorted(answer.status_code for answer in answers) == [200, 401]


def test_a_user_with_mfa_logs_in_with_a_passkey_without_a_code(client, auth, rdb):
    tokens = auth.new_user_tokens()
    headers = bearer(tokens["access_token"])
    secret = client.post("/auth/mfa/totp/setup", headers=headers).get_json()["secret"]
    assert (
        client.post("/auth/mfa/totp/confirm", json={"code": pyotp.TOTP(secret).now()}, headers=headers).status_code
        == 200
    )
    device = authenticator()
    assert add_passkey(client, tokens["access_token"], device).status_code == 201
    password = client.post("/auth/login", json={"email": tokens["email"], "password": DEFAULT_PASSWORD})
    assert refused(password, 401, "mfa_required")
    answer = passkey_login(client, device)
    assert answer.status_code == 200 and answer.get_json()["user"]["mfa_enabled"] is True


def test_require_verified_email_applies_to_passkey_logins(make_app, rdb):
    plain = https_client(make_app())
    tokens = AuthActions(plain).new_user_tokens()
    device = authenticator()
    assert add_passkey(plain, tokens["access_token"], device).status_code == 201
    strict = https_client(make_app(REQUIRE_VERIFIED_EMAIL="true"))
    assert refused(passkey_login(strict, device), 403, "email_not_verified")
    stranger = authenticator()
    stranger.create(creation_options(plain, tokens["access_token"]))
    assert refused(passkey_login(strict, stranger))  # a refused passkey stays 401, as a wrong password does
    rdb.hset(Keys.user(tokens["user"]["id"]), "email_verified", "1")
    assert passkey_login(strict, device).status_code == 200


def test_passkey_logins_are_rate_limited_per_address_and_per_account(make_app, auth):
    app = make_app(RATE_LIMITS_ENABLED="true", RATE_LIMIT_LOGIN="3/minute", RATE_LIMIT_PASSKEY_OPTIONS="5/minute")
    client = https_client(app)
    tokens = AuthActions(client).new_user_tokens()
    device = authenticator()
    assert add_passkey(client, tokens["access_token"], device).status_code == 201

    def attempt(address: str, **get) -> int:
        headers = {"X-Forwarded-For": address}
        started = client.post("/auth/passkeys/login/options", headers=headers).get_json()
        body = {"login_id": started["login_id"], "credential": device.get(started["options"], **get)}
        return client.post("/auth/passkeys/login", json=body, headers=headers).status_code

    # Per account: the owner's credential, from a new address each time.
    assert [attempt(f"198.51.100.{n}", bad_signature=True) for n in range(4)] == [401, 401, 401, 429]
    assert attempt("198.51.100.99") == 429  # the right answer too, until the window has passed

    # Per address: credentials of no account (a new one each time), from one address.
    def garbage(n: int) -> dict:
        credential_id = f"AAA{n}"
        return {"login_id": "x", "credential": {"id": credential_id, "rawId": credential_id, "type": "public-key"}}

    answers = [
        client.post("/auth/passkeys/login", json=garbage(n), headers={"X-Forwarded-For": "203.0.113.5"}).status_code
        for n in range(4)
    ]
    assert answers == [400, 400, 400, 429]
    limited = client.post("/auth/passkeys/login", json=garbage(5), headers={"X-Forwarded-For": "203.0.113.5"})
    assert refused(limited, 429, "rate_limited") and "Retry-After" in limited.headers
    # The options are limited per address too (they cost a key in Redis each), by a limit of their own: the
    # page asks for them at every logged-out view, which RATE_LIMIT_LOGIN would cut short behind one address.
    options = [
        client.post("/auth/passkeys/login/options", headers={"X-Forwarded-For": "203.0.113.9"}).status_code
        for _ in range(6)
    ]
    assert options == [200, 200, 200, 200, 200, 429]


def test_login_options_never_tell_whether_an_address_has_passkeys(client, owner):
    answers = [
        client.post("/auth/passkeys/login/options", json=body)
        for body in ({"email": owner["email"]}, {"email": "nobody-here@example.com"}, {}, None)
    ]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 200]
    shapes = []
    for answer in answers:
        body = answer.get_json()
        options = body["options"]
        assert options["allowCredentials"] == [] and options["userVerification"] == "required"
        assert options["rpId"] == RP_ID and len(from_b64url(options["challenge"])) >= 16
        shapes.append((tuple(sorted(body)), tuple(sorted(options)), len(body["login_id"]), len(options["challenge"])))
    assert len(set(shapes)) == 1
    assert len({answer.get_json()["login_id"] for answer in answers}) == 4


def test_a_login_asked_for_with_an_e_mail_is_for_that_account_alone(client, auth, owner):
    """A page that asked for bob's login must not log in whoever's passkey answers it: a credential of another
    account, or any credential when no account has the address, is refused; the owner's own one passes."""
    intruder = auth.new_user_tokens()
    intruders_device = authenticator()
    assert add_passkey(client, intruder["access_token"], intruders_device).status_code == 201

    def login(device: Authenticator, **asked):
        options, login_id = request_options(client, **asked)
        return client.post("/auth/passkeys/login", json={"login_id": login_id, "credential": device.get(options)})

    assert login(intruders_device).status_code == 200  # discoverable: whoever answers, as before
    assert refused(login(intruders_device, email=owner["email"]))
    assert refused(login(intruders_device, email="nobody-here@example.com"))
    assert refused(login(owner["device"], email="nobody-here@example.com"))
    signed_in = login(owner["device"], email=owner["email"].upper())
    assert signed_in.status_code == 200 and signed_in.get_json()["user"]["id"] == owner["user"]["id"]


# Re-authentication.


def test_a_passkey_re_authenticates_and_enables_mfa_setup(client, owner, rdb):
    headers = bearer(owner["access_token"])
    age_login(rdb, owner, 6 * 60)
    assert refused(client.post("/auth/mfa/totp/setup", headers=headers), 403, "reauthentication_required")
    options, login_id = request_options(client)
    wrong = owner["device"].get(options, origin="https://evil.example")
    answer = client.post("/auth/reauthenticate", json={"login_id": login_id, "credential": wrong}, headers=headers)
    assert refused(answer)
    assert client.get("/auth/me", headers=headers).status_code == 200  # the session goes on
    assert refused(client.post("/auth/mfa/totp/setup", headers=headers), 403, "reauthentication_required")
    options, login_id = request_options(client)
    proof = {"login_id": login_id, "credential": owner["device"].get(options)}
    assert client.post("/auth/reauthenticate", json=proof, headers=headers).status_code == 204
    assert client.post("/auth/mfa/totp/setup", headers=headers).status_code == 200


def test_re_authentication_takes_only_the_callers_own_passkey(client, auth, owner, rdb):
    other = auth.new_user_tokens()
    headers = bearer(other["access_token"])
    age_login(rdb, other, 6 * 60)
    options, login_id = request_options(client)
    proof = {"login_id": login_id, "credential": owner["device"].get(options)}
    assert refused(client.post("/auth/reauthenticate", json=proof, headers=headers))
    assert refused(client.post("/auth/passkeys/register/options", headers=headers), 403, "reauthentication_required")
    assert client.get("/auth/me", headers=headers).status_code == 200


# Bad input, other users' passkeys.


@pytest.mark.parametrize(
    "credential",
    [
        None,
        "a string",
        ["a", "list"],
        {},
        {"id": "AAAA", "rawId": "AAAA", "type": "public-key"},
        {"id": "AAAA", "rawId": "AAAA", "type": "public-key", "response": "no"},
        {"id": "AAAA", "rawId": "AAAA", "type": "secret-key", "response": {}},
        {"id": 5, "rawId": "AAAA", "type": "public-key", "response": {}},
        {"id": "AAAA", "rawId": "A", "type": "public-key", "response": {"clientDataJSON": "A"}},
    ],
)
def test_malformed_credentials_are_400(client, owner, credential):
    token = owner["access_token"]
    creation_options(client, token)
    body = {} if credential is None else {"credential": credential}
    assert refused(client.post("/auth/passkeys", json=body, headers=bearer(token)), 400, "bad_request")
    _, login_id = request_options(client)
    login = client.post("/auth/passkeys/login", json={**body, "login_id": login_id})
    assert refused(login, 400, "bad_request")
    reauth = client.post("/auth/reauthenticate", json={**body, "login_id": login_id}, headers=bearer(token))
    assert refused(reauth, 400, "bad_request")


def test_garbage_inside_a_well_formed_credential_is_a_refusal_not_an_error(client, owner):
    token = owner["access_token"]
    for field, value in (("attestationObject", b64url(b"\xff" * 40)), ("clientDataJSON", b64url(b"{not json"))):
        credential = authenticator().create(creation_options(client, token))
        broken = {**credential, "response": {**credential["response"], field: value}}
        assert refused(
            client.post("/auth/passkeys", json={"credential": broken}, headers=bearer(token)), 422, "validation_failed"
        )
    for field, value in (("authenticatorData", b64url(b"\x00" * 3)), ("signature", b64url(b"\x30\x02"))):
        options, login_id = request_options(client)
        assertion = owner["device"].get(options)
        broken = {**assertion, "response": {**assertion["response"], field: value}}
        assert refused(client.post("/auth/passkeys/login", json={"login_id": login_id, "credential": broken}))
    wrong_types = [{"login_id": 5, "credential": {}}, {"credential": {}}, {"login_id": "x"}, {"login_id": "x" * 5000}]
    for body in wrong_types:
        answer = client.post("/auth/passkeys/login", json=body)
        assert answer.status_code in (400, 422), body


def test_another_users_passkey_cannot_be_seen_renamed_or_removed(client, auth, owner):
    other = bearer(auth.new_user_tokens()["access_token"])
    passkey_id = owner["passkey"]["id"]
    assert client.get("/auth/passkeys", headers=other).get_json() == {"passkeys": []}
    assert refused(client.delete(f"/auth/passkeys/{passkey_id}", headers=other), 404, "not_found")
    assert refused(client.patch(f"/auth/passkeys/{passkey_id}", json={"name": "Mine"}, headers=other), 404, "not_found")
    for unknown in ("AAAA", "not%20an%20id", "x" * 2000):
        assert client.delete(f"/auth/passkeys/{unknown}", headers=bearer(owner["access_token"])).status_code == 404
    assert passkey_login(client, owner["device"]).status_code == 200


@pytest.mark.parametrize("name", ["", "   ", "tab\tin it", "x" * 65, "bell\x07"])
def test_passkey_names_are_bounded_plain_text(client, owner, name):
    token = owner["access_token"]
    answer = client.patch(f"/auth/passkeys/{owner['passkey']['id']}", json={"name": name}, headers=bearer(token))
    assert refused(answer, 422, "validation_failed")
    assert refused(add_passkey(client, token, authenticator(), name=name), 422, "validation_failed")
    assert client.get("/auth/passkeys", headers=bearer(token)).get_json()["passkeys"] == [owner["passkey"]]


# The account's life.


def test_deleting_the_user_deletes_its_passkeys_and_frees_their_ids(app, client, auth, owner, rdb):
    credential_id = owner["passkey"]["id"]
    with app.app_context():
        assert users.delete_user(owner["user"]["id"])
    assert not rdb.exists(Keys.user_passkeys(owner["user"]["id"]))
    assert not rdb.exists(Keys.user_by_passkey(credential_id))
    assert refused(passkey_login(client, owner["device"]))
    newcomer = auth.new_user_tokens()
    reused = add_passkey(client, newcomer["access_token"], authenticator(), credential_id=from_b64url(credential_id))
    assert reused.status_code == 201


def test_a_password_reset_keeps_the_passkeys(app, client, owner):
    with app.app_context():
        token = mailtokens.issue_token(owner["user"]["id"], owner["email"], mailtokens.RESET)
    reset = client.post("/auth/password/reset", json={"token": token, "new_password": "a brand new passphrase"})
    assert reset.status_code == 204
    assert client.get("/auth/me", headers=bearer(owner["access_token"])).status_code == 401  # sessions ended
    answer = passkey_login(client, owner["device"])
    assert answer.status_code == 200
    listed = client.get("/auth/passkeys", headers=bearer(answer.get_json()["access_token"])).get_json()["passkeys"]
    assert [p["id"] for p in listed] == [owner["passkey"]["id"]]


def test_logging_out_everywhere_keeps_the_passkeys_and_stops_a_registration_under_way(client, owner):
    token = owner["access_token"]
    options = creation_options(client, token)
    credential = authenticator().create(options)
    assert client.post("/auth/logout-all", headers=bearer(token)).status_code == 204
    assert client.post("/auth/passkeys", json={"credential": credential}, headers=bearer(token)).status_code == 401
    assert passkey_login(client, owner["device"]).status_code == 200


# Settings.


@pytest.mark.parametrize("host", ["[", "x:99999", "a b", "127.0.0.1:8080"])
def test_a_host_that_names_no_rp_id_is_400(client, owner, host):
    headers = {**bearer(owner["access_token"]), "Host": host}
    assert refused(client.post("/auth/passkeys/register/options", headers=headers), 400, "bad_request")
    assert refused(client.post("/auth/passkeys/login/options", headers={"Host": host}), 400, "bad_request")


def test_configured_rp_id_and_origins_decide_what_a_passkey_is_bound_to(make_app):
    app = make_app(WEBAUTHN_RP_ID="localhost", WEBAUTHN_ORIGINS="https://app.localhost, https://localhost:8443")
    client = https_client(app)
    tokens = AuthActions(client).new_user_tokens()
    device = Authenticator(origin="https://app.localhost", rp_id="localhost")
    assert add_passkey(client, tokens["access_token"], device).status_code == 201
    assert passkey_login(client, device).status_code == 200
    assert passkey_login(client, device, origin="https://localhost:8443").status_code == 200
    assert refused(passkey_login(client, device, origin=ORIGIN))  # the request's own origin is not listed
    named = https_client(make_app(WEBAUTHN_RP_NAME="Example Accounts"))
    tokens = AuthActions(named).new_user_tokens()
    assert creation_options(named, tokens["access_token"])["rp"] == {"id": RP_ID, "name": "Example Accounts"}


def test_an_ip_address_in_public_base_url_gives_no_rp_id(make_app):
    """Browsers bind passkeys to a domain name only: an IP address there leaves the RP ID to be configured."""
    settings = make_app(PUBLIC_BASE_URL="http://127.0.0.1:8080").config["SETTINGS"].webauthn
    assert settings.rp_id is None


def test_public_base_url_gives_the_defaults(make_app):
    client = https_client(make_app(PUBLIC_BASE_URL="https://auth.localhost/service"))
    options, _ = request_options(client)
    assert options["rpId"] == "auth.localhost"
    tokens = AuthActions(client).new_user_tokens()
    device = Authenticator(origin="https://auth.localhost", rp_id="auth.localhost")
    assert add_passkey(client, tokens["access_token"], device).status_code == 201
    assert refused(passkey_login(client, device, origin=ORIGIN))


@pytest.mark.parametrize(
    "settings, named",
    [
        ({"WEBAUTHN_ORIGINS": "auth.example.com"}, "WEBAUTHN_ORIGINS"),
        ({"WEBAUTHN_ORIGINS": "https://auth.example.com/login"}, "WEBAUTHN_ORIGINS"),
        ({"WEBAUTHN_ORIGINS": "ftp://auth.example.com"}, "WEBAUTHN_ORIGINS"),
        ({"WEBAUTHN_ORIGINS": "https://auth.example.com:http"}, "WEBAUTHN_ORIGINS"),
        ({"WEBAUTHN_RP_ID": "https://example.com"}, "WEBAUTHN_RP_ID"),
        ({"WEBAUTHN_RP_ID": "example.com:443"}, "WEBAUTHN_RP_ID"),
        ({"WEBAUTHN_RP_ID": "127.0.0.1"}, "WEBAUTHN_RP_ID"),  # browsers bind passkeys to no IP address
        ({"WEBAUTHN_RP_ID": "example.com", "WEBAUTHN_ORIGINS": "https://example.org"}, "WEBAUTHN_ORIGINS"),
        ({"WEBAUTHN_RP_ID": "example.com", "PUBLIC_BASE_URL": "https://other.test"}, "WEBAUTHN_ORIGINS"),
    ],
)
def test_webauthn_settings_are_checked_at_start_up(settings, named):
    environ = {"APP_ENV": "test", "SECRET_KEY": "s" * 40, "JWT_SECRET": "j" * 40}
    with pytest.raises(SettingsError, match=named):
        load_settings({**environ, **settings})
    unset = load_settings(environ).webauthn
    assert (unset.rp_id, unset.origins, unset.rp_name) == (None, (), "auth-rt")
    normalised = load_settings({**environ, "WEBAUTHN_ORIGINS": "HTTPS://Auth.Example.com:443/"}).webauthn
    assert normalised.origins == ("https://auth.example.com",)
