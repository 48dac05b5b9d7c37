"""OAuth login against a real OpenID provider (node-oidc-provider), driven like a browser would."""

from __future__ import annotations

import base64
import http.cookiejar
import os
import re
import time
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from urllib.parse import parse_qs, urljoin, urlparse

import flask
import pyotp
import pytest
import requests
from flask import Flask
from flask.sessions import NullSession

from app.redis import Keys
from tests.conftest import TEST_SECRET_KEY
from tests.servers import CLIENT_ID, CLIENT_SECRET, LiveServer, OpenIdProvider
from tests.utils import DEFAULT_PASSWORD, parse_set_cookies, random_email, redis_snapshot
from tests.webauthn_authenticator import Authenticator

STATE_COOKIE = "__Secure-oauth"


@pytest.fixture(autouse=True)
def secure_cookies_to_loopback(monkeypatch):
    """Send Secure cookies to http://127.0.0.1, as browsers do for loopback (a secure context).

    requests copies cookies into a jar with the default policy on every request, so the default
    policy is what has to allow it, for this module's tests only.
    """
    default = http.cookiejar.DefaultCookiePolicy.return_ok_secure

    def return_ok_secure(self, cookie, request):
        return urlparse(request.get_full_url()).hostname == "127.0.0.1" or default(self, cookie, request)

    monkeypatch.setattr(http.cookiejar.DefaultCookiePolicy, "return_ok_secure", return_ok_secure)


def browser() -> requests.Session:
    return requests.Session()


@pytest.fixture(scope="module")
def oauth_setup(base_env, tmp_path_factory):
    logs = tmp_path_factory.mktemp("oauth")
    provider = OpenIdProvider(logs / "provider.log")
    app = LiveServer({**base_env}, workers=1, log_path=logs / "app.log")
    provider.start(f"{app.url}/auth/oauth/test/callback")
    app.env.update(
        OAUTH_PROVIDERS="test",
        OAUTH_TEST_CLIENT_ID=CLIENT_ID,
        OAUTH_TEST_CLIENT_SECRET=CLIENT_SECRET,
        OAUTH_TEST_DISCOVERY_URL=f"{provider.url}/.well-known/openid-configuration",
        OAUTH_TEST_SCOPE="openid email",
    )
    app.start()
    yield app, provider
    app.stop()
    provider.stop()


def set_cookies(response: requests.Response) -> dict:
    return parse_set_cookies(response.raw.headers.getlist("Set-Cookie"))


def start_login(client: requests.Session, app: LiveServer, next_path: str = "/") -> requests.Response:
    response = client.get(f"{app.url}/auth/oauth/test/login", params={"next": next_path}, allow_redirects=False)
    assert response.status_code == 302, response.text
    return response


def callback_url(client: requests.Session, app: LiveServer, provider: OpenIdProvider, login: str, next_path="/"):
    """Go through the provider's login and consent screens; the URL it sends the browser back to."""
    url = start_login(client, app, next_path).headers["Location"]
    while True:
        response = client.get(url, allow_redirects=False)
        if response.status_code in (302, 303):
            url = urljoin(url, response.headers["Location"])
            if url.startswith(app.url):
                return url
            continue
        form = re.search(r'<form[^>]*action="([^"]+)"', response.text)
        assert form, response.text[:500]
        fields = form_fields(response.text)  # hidden fields (the screen's `prompt`) as a browser sends them
        if "login" in fields:
            fields.update(login=login, password="anything")
        response = client.post(urljoin(url, form.group(1)), data=fields, allow_redirects=False)
        assert "Location" in response.headers, (response.status_code, response.text[:500])
        url = urljoin(url, response.headers["Location"])
        if url.startswith(app.url):
            return url


def form_fields(page: str) -> dict:
    fields = {}
    for tag in re.findall(r"<input[^>]*>", page):
        name = re.search(r'name="([^"]*)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name:
            fields[name.group(1)] = value.group(1) if value else ""
    return fields


def finish(client, url) -> requests.Response:
    return client.get(url, allow_redirects=False)


def test_login_redirect_carries_every_parameter_and_a_lax_state_cookie(oauth_setup):
    app, provider = oauth_setup
    response = start_login(browser(), app, "/after")
    location = urlparse(response.headers["Location"])
    assert f"{location.scheme}://{location.netloc}" == provider.url
    query = {k: v[0] for k, v in parse_qs(location.query).items()}
    assert query["response_type"] == "code" and query["client_id"] == CLIENT_ID
    assert query["redirect_uri"] == f"{app.url}/auth/oauth/test/callback"
    assert "openid" in query["scope"].split()
    assert query["code_challenge_method"] == "S256"
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", query["code_challenge"])  # base64url SHA-256, unpadded
    assert len(query["state"]) >= 20 and len(query["nonce"]) >= 20
    cookie = set_cookies(response)[STATE_COOKIE]
    assert cookie["httponly"] is True and cookie["secure"] is True and cookie["samesite"] == "Lax"
    assert cookie["path"] == "/auth/oauth"
    lifetime = parsedate_to_datetime(cookie["expires"]) - datetime.now(UTC)
    assert timedelta(minutes=9) < lifetime <= timedelta(minutes=10)  # short-lived


def test_states_differ_per_attempt(oauth_setup):
    app, _ = oauth_setup
    states = {parse_qs(urlparse(start_login(browser(), app).headers["Location"]).query)["state"][0] for _ in range(3)}
    assert len(states) == 3


def test_unfinished_logins_cannot_grow_the_state_cookie_without_bound(oauth_setup):
    """A hostile page starting logins in a loop must not push the cookie past what browsers keep."""
    app, provider = oauth_setup
    client = browser()
    for _ in range(100):
        start_login(client, app)
    cookie = client.cookies.get(STATE_COOKIE, path="/auth/oauth")
    assert cookie is not None and len(cookie) < 1024, len(cookie)
    url = callback_url(client, app, provider, random_email())  # the newest attempt still completes
    response = finish(client, url)
    assert response.status_code == 302 and "__Host-access" in set_cookies(response)


def test_full_flow_logs_in_and_a_second_login_finds_the_same_user(oauth_setup):
    app, provider = oauth_setup
    email = random_email()
    client = browser()
    before = provider.token_requests()
    response = finish(client, callback_url(client, app, provider, email, "/dashboard"))
    assert response.status_code == 302, response.text
    assert provider.token_requests() == before + 1  # the provider accepted the code and the verifier
    cookies = set_cookies(response)
    assert cookies["__Host-access"]["samesite"] == "Strict" and cookies["__Host-access"]["httponly"] is True
    assert cookies[STATE_COOKIE]["max-age"] == "0"  # used once, then deleted
    landing = client.get(urljoin(app.url, response.headers["Location"]))
    assert landing.status_code == 200
    assert 'http-equiv="refresh"' in landing.text and "url=/dashboard" in landing.text
    me = client.get(f"{app.url}/auth/me")
    assert me.status_code == 200 and me.json()["user"]["email"] == email
    first_id = me.json()["user"]["id"]

    again = browser()
    finish(again, callback_url(again, app, provider, email))
    assert again.get(f"{app.url}/auth/me").json()["user"]["id"] == first_id
    sessions = again.get(f"{app.url}/auth/sessions").json()["sessions"]
    assert len(sessions) == 2  # two logins, two sessions of one user


def test_refused_callbacks_are_400_and_never_reach_the_provider(oauth_setup, redis_server):
    app, provider = oauth_setup
    client = browser()
    url = callback_url(client, app, provider, random_email())
    code, state = (parse_qs(urlparse(url).query)[k][0] for k in ("code", "state"))
    callback = f"{app.url}/auth/oauth/test/callback"
    before_tokens, before_keys = provider.token_requests(), redis_snapshot(redis_server.client())

    def refused(response):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "invalid_state"

    refused(client.get(callback, params={"code": code, "state": "not-the-state"}))  # wrong state
    refused(client.get(callback, params={"code": code}))  # missing state
    refused(browser().get(callback, params={"code": code, "state": state}))  # another browser's attempt
    tampered = browser()
    value = client.cookies.get(STATE_COOKIE)
    tampered.cookies.set(STATE_COOKIE, value[:-3] + ("AAA" if not value.endswith("AAA") else "BBB"))
    refused(tampered.get(callback, params={"code": code, "state": state}))  # tampered state cookie
    assert provider.token_requests() == before_tokens
    assert redis_snapshot(redis_server.client()) == before_keys  # nothing stored

    saved_cookie = client.cookies.get(STATE_COOKIE)
    assert finish(client, url).status_code == 302  # the real callback, once
    refused(finish(client, url))  # replayed: the state was used
    replay = browser()
    replay.cookies.set(STATE_COOKIE, saved_cookie)
    refused(replay.get(callback, params={"code": code, "state": state}))  # replayed with the old cookie too
    assert provider.token_requests() == before_tokens + 1


def test_wrong_code_verifier_is_rejected_by_the_provider_as_a_clean_error(oauth_setup):
    app, provider = oauth_setup
    client = browser()
    url = callback_url(client, app, provider, random_email())
    state = parse_qs(urlparse(url).query)["state"][0]
    signer = Flask(__name__)
    signer.secret_key = TEST_SECRET_KEY
    serializer = signer.session_interface.get_signing_serializer(signer)
    session = serializer.loads(client.cookies.get(STATE_COOKIE))
    session[f"_state_test_{state}"]["data"]["code_verifier"] = base64.urlsafe_b64encode(os.urandom(48)).decode()
    client.cookies.set(STATE_COOKIE, serializer.dumps(session), domain="127.0.0.1", path="/auth/oauth")
    before = provider.token_requests()
    response = finish(client, url)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "oauth_failed"
    assert provider.token_requests() == before + 1  # it reached the provider, which refused it
    assert client.get(f"{app.url}/auth/me").status_code == 401


def test_provider_error_parameter_is_a_clear_400(oauth_setup):
    app, _ = oauth_setup
    client = browser()
    state = parse_qs(urlparse(start_login(client, app).headers["Location"]).query)["state"][0]
    response = client.get(f"{app.url}/auth/oauth/test/callback", params={"error": "access_denied", "state": state})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "oauth_error" and "access_denied" in response.json()["error"]["message"]


def test_verified_email_links_to_the_existing_account(oauth_setup):
    app, provider = oauth_setup
    email = random_email()
    local = requests.post(f"{app.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD}).json()
    client = browser()
    assert finish(client, callback_url(client, app, provider, email)).status_code == 302
    assert client.get(f"{app.url}/auth/me").json()["user"]["id"] == local["user"]["id"]


def test_a_provider_login_takes_over_an_account_whose_address_was_never_verified(oauth_setup, redis_server):
    """Pre-hijacking: someone registers the victim's address with a password of their own, never verifies
    it, and keeps a session and a second factor; the victim later logs in with a provider that vouches
    for the address. The provider identity gets the account, and the first registrant keeps no way in."""
    app, provider = oauth_setup
    rdb = redis_server.client()
    email = random_email()
    registered = requests.post(f"{app.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    user_id = registered.json()["user"]["id"]
    attacker = requests.post(
        f"{app.url}/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}
    ).json()
    headers = {"Authorization": f"Bearer {attacker['access_token']}"}
    secret = requests.post(f"{app.url}/auth/mfa/totp/setup", headers=headers).json()["secret"]
    confirmed = requests.post(
        f"{app.url}/auth/mfa/totp/confirm", json={"code": pyotp.TOTP(secret).now()}, headers=headers
    )
    assert confirmed.status_code == 200
    # Passkeys at a domain name (browsers take no IP address): the defaults are the request's host and origin.
    named = app.url.replace("127.0.0.1", "localhost")
    passkey = Authenticator(origin=named, rp_id="localhost")
    options = requests.post(f"{named}/auth/passkeys/register/options", headers=headers).json()["options"]
    added = requests.post(f"{named}/auth/passkeys", json={"credential": passkey.create(options)}, headers=headers)
    assert added.status_code == 201
    credential_id = added.json()["id"]
    assert rdb.get(Keys.user_by_passkey(credential_id)) == user_id
    version = int(rdb.hget(Keys.user(user_id), "token_version"))

    victim = browser()
    landing = finish(victim, callback_url(victim, app, provider, email))
    assert landing.status_code == 302 and not landing.headers["Location"].startswith("/login-mfa")  # no code asked
    me = victim.get(f"{app.url}/auth/me").json()["user"]
    assert me["id"] == user_id and me["email_verified"] is True and me["mfa_enabled"] is False

    assert requests.get(f"{app.url}/auth/me", headers=headers).status_code == 401
    refresh = requests.post(f"{app.url}/auth/refresh", json={"refresh_token": attacker["refresh_token"]})
    assert refresh.status_code == 401
    login = requests.post(f"{app.url}/auth/login", json={"email": email, "password": DEFAULT_PASSWORD})
    assert login.status_code == 401 and login.json()["error"]["code"] == "invalid_credentials"
    record = rdb.hgetall(Keys.user(user_id))
    assert record["password_hash"] == "" and "totp_secret" not in record
    assert int(record["token_version"]) == version + 1
    assert not rdb.exists(Keys.user_recovery_codes(user_id))
    # The first registrant's passkey is gone with the rest, its credential id released.
    assert not rdb.exists(Keys.user_passkeys(user_id)) and "passkey_handle" not in record
    assert not rdb.exists(Keys.user_by_passkey(credential_id))
    started = requests.post(f"{named}/auth/passkeys/login/options").json()
    body = {"login_id": started["login_id"], "credential": passkey.get(started["options"]), "transport": "body"}
    passkey_login = requests.post(f"{named}/auth/passkeys/login", json=body)
    assert passkey_login.status_code == 401 and passkey_login.json()["error"]["code"] == "invalid_credentials"
    assert victim.get(f"{app.url}/auth/passkeys").json() == {"passkeys": []}
    # The victim's own session goes on, and a later provider login finds the same account.
    assert victim.get(f"{app.url}/auth/me").status_code == 200
    again = browser()
    assert finish(again, callback_url(again, app, provider, email)).status_code == 302
    assert again.get(f"{app.url}/auth/me").json()["user"]["id"] == user_id


def test_an_identity_linked_by_an_unverified_address_is_released_by_the_takeover(oauth_setup, redis_server):
    """The first registrant may have come through a provider that does not vouch for the address; that
    identity goes with the rest, so it cannot log in to the account either."""
    app, provider = oauth_setup
    email = random_email()
    first = browser()
    assert finish(first, callback_url(first, app, provider, f"unverified.{email}")).status_code == 302
    assert first.get(f"{app.url}/auth/me").json()["user"]["email_verified"] is False
    user_id = first.get(f"{app.url}/auth/me").json()["user"]["id"]

    victim = browser()
    assert finish(victim, callback_url(victim, app, provider, email)).status_code == 302
    assert victim.get(f"{app.url}/auth/me").json()["user"]["id"] == user_id
    assert first.get(f"{app.url}/auth/me").status_code == 401
    again = browser()  # the unverified identity is now a stranger to the account
    response = finish(again, callback_url(again, app, provider, f"unverified.{email}"))
    assert response.status_code == 409 and again.get(f"{app.url}/auth/me").status_code == 401


def test_unverified_email_is_not_linked_to_an_existing_account(oauth_setup):
    app, provider = oauth_setup
    email = random_email()
    requests.post(f"{app.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    client = browser()
    response = finish(client, callback_url(client, app, provider, f"unverified.{email}"))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "conflict"
    assert client.get(f"{app.url}/auth/me").status_code == 401
    # The owner's password login is untouched.
    login = requests.post(f"{app.url}/auth/login", json={"email": email, "password": DEFAULT_PASSWORD})
    assert login.status_code == 200


def test_unverified_email_without_a_local_account_creates_one(oauth_setup):
    app, provider = oauth_setup
    email = random_email()
    client = browser()
    assert finish(client, callback_url(client, app, provider, f"unverified.{email}")).status_code == 302
    assert client.get(f"{app.url}/auth/me").json()["user"]["email"] == email


@pytest.mark.parametrize("next_path", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "evil"])
def test_next_must_be_a_relative_path(oauth_setup, next_path):
    app, _ = oauth_setup
    response = browser().get(f"{app.url}/auth/oauth/test/login", params={"next": next_path}, allow_redirects=False)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


def test_unknown_provider_is_404(oauth_setup):
    app, _ = oauth_setup
    assert browser().get(f"{app.url}/auth/oauth/nope/login", allow_redirects=False).status_code == 404
    assert browser().get(f"{app.url}/auth/oauth/nope/callback?state=x&code=y").status_code == 404


def test_oauth_accounts_count_as_verified_only_when_the_provider_says_so(oauth_setup):
    app, provider = oauth_setup
    verified, unverified = browser(), browser()
    email = random_email()
    assert finish(verified, callback_url(verified, app, provider, email)).status_code == 302
    assert verified.get(f"{app.url}/auth/me").json()["user"]["email_verified"] is True
    other = random_email()
    assert finish(unverified, callback_url(unverified, app, provider, f"unverified.{other}")).status_code == 302
    assert unverified.get(f"{app.url}/auth/me").json()["user"]["email_verified"] is False


def test_linking_a_verified_provider_address_verifies_the_local_account(oauth_setup):
    app, provider = oauth_setup
    email = random_email()
    requests.post(f"{app.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    login = requests.post(f"{app.url}/auth/login", json={"email": email, "password": DEFAULT_PASSWORD})
    assert login.json()["user"]["email_verified"] is False
    client = browser()
    assert finish(client, callback_url(client, app, provider, email)).status_code == 302
    assert client.get(f"{app.url}/auth/me").json()["user"]["email_verified"] is True


def test_an_account_with_mfa_still_needs_its_code_after_an_oauth_login(oauth_setup, redis_server):
    app, provider = oauth_setup
    email = random_email()
    registered = requests.post(f"{app.url}/auth/register", json={"email": email, "password": DEFAULT_PASSWORD})
    # Its owner proved the address (the mailed link), so the provider's login is linked, not a takeover.
    redis_server.client().hset(Keys.user(registered.json()["user"]["id"]), "email_verified", "1")
    tokens = requests.post(
        f"{app.url}/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}
    ).json()
    headers = {"Authorization": f"Bearer {tokens['access_token']}"}
    secret = requests.post(f"{app.url}/auth/mfa/totp/setup", headers=headers).json()["secret"]
    totp = pyotp.TOTP(secret)
    confirmed = requests.post(f"{app.url}/auth/mfa/totp/confirm", json={"code": totp.now()}, headers=headers)
    assert confirmed.status_code == 200

    client = browser()
    response = finish(client, callback_url(client, app, provider, email))
    assert response.status_code == 302 and response.headers["Location"].startswith("/login-mfa#mfa_token=")
    assert "__Host-access" not in set_cookies(response)  # no session before the second factor
    assert client.get(f"{app.url}/auth/me").status_code == 401
    mfa_token = response.headers["Location"].partition("#mfa_token=")[2]
    done = client.post(
        f"{app.url}/auth/login/mfa",
        json={"mfa_token": mfa_token, "code": totp.at(time.time() + 30), "transport": "body"},
    )
    assert done.status_code == 200 and done.json()["user"]["email"] == email


@pytest.mark.parametrize("path, opened", [("/auth/oauth/dev/login", True), ("/auth/me", False), ("/healthz", False)])
def test_the_state_cookie_is_read_only_under_the_oauth_paths(app, path, opened):
    with app.test_request_context(path):
        assert isinstance(flask.session._get_current_object(), NullSession) is not opened
