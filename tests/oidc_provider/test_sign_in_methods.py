"""Every way of signing in on the service's page leads back into an authorization, and the ID token says which it
was (`amr`, RFC 8176): a password, a password and TOTP (or a recovery code), a passkey (the suite's software
authenticator), another OpenID provider (node-oidc-provider, as in tests/auth/test_oauth.py). And the page itself,
in Chromium, goes on to an authorization request once signed in, and nowhere else; it lists the applications the
user allowed, and withdraws one.

How a sign-in went is a field of the session written with it: its Redis steps run on the cluster in test_flows.
"""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urljoin

import pyotp
import pytest
import requests
from playwright.sync_api import expect

from app import create_app
from tests.auth.test_oauth import form_fields
from tests.oidc_provider.flows_support import (
    Answer,
    Browser,
    RelyingParty,
    Service,
    authorized,
    secure_cookies_to_loopback,  # noqa: F401 - a module-scoped autouse fixture
)
from tests.servers import CLIENT_ID, CLIENT_SECRET, LiveServer, OpenIdProvider
from tests.utils import DEFAULT_PASSWORD, bearer
from tests.webauthn_authenticator import Authenticator

pytestmark = pytest.mark.not_on_cluster("how a sign-in went is a session field; its Redis steps run in test_flows")


@pytest.fixture(scope="module")
def service(base_env, tmp_path_factory):
    """The service with another OpenID provider to log in with, its own issuer its address."""
    directory = tmp_path_factory.mktemp("oidc-sign-in")
    provider = OpenIdProvider(directory / "provider.log")
    web = LiveServer(base_env, log_path=directory / "gunicorn.log")
    provider.start(f"{web.url}/auth/oauth/test/callback")
    oauth = {
        "OAUTH_PROVIDERS": "test",
        "OAUTH_TEST_CLIENT_ID": CLIENT_ID,
        "OAUTH_TEST_CLIENT_SECRET": CLIENT_SECRET,
        "OAUTH_TEST_DISCOVERY_URL": f"{provider.url}/.well-known/openid-configuration",
        "OAUTH_TEST_SCOPE": "openid email",
    }
    web.env.update(oauth, OIDC_ISSUER=web.url)
    web.start()
    running = Service(web, create_app({**base_env, **oauth, "OIDC_ISSUER": web.url}))
    running.discovery = running.call("GET", "/.well-known/openid-configuration").json()
    yield running
    web.stop()
    provider.stop()


def first_party(service: Service) -> RelyingParty:
    client, secret = service.new_client(first_party=True)
    return RelyingParty(service, client, secret, "openid email")


def amr_of(rp: RelyingParty, answer: Answer) -> list[str]:
    assert answer.at_client and "code" in answer.params, (answer.response.status_code, answer.location)
    return rp.verified_id_token(rp.redeem(answer))["amr"]


def with_totp(service: Service) -> tuple[dict, pyotp.TOTP, list[str]]:
    """A user with TOTP on: the user, its TOTP, its recovery codes."""
    user = service.new_user()
    body = {"email": user["email"], "password": DEFAULT_PASSWORD, "transport": "body"}
    token = service.call("POST", "/auth/login", json=body).json()["access_token"]
    totp = pyotp.TOTP(service.call("POST", "/auth/mfa/totp/setup", headers=bearer(token)).json()["secret"])
    confirmed = service.call("POST", "/auth/mfa/totp/confirm", json={"code": totp.now()}, headers=bearer(token))
    assert confirmed.status_code == 200, confirmed.text
    return user, totp, confirmed.json()["recovery_codes"]


def second_step(browser: Browser, email: str, **factor) -> None:
    """The page's login with MFA: the password (401 mfa_required), then the second factor."""
    first = browser.sign_in(email)
    assert first.status_code == 401 and first.json()["error"]["code"] == "mfa_required"
    body = {"mfa_token": first.json()["mfa_token"], "transport": "cookie", **factor}
    finished = browser.post(browser.service.url + "/auth/login/mfa", json=body, timeout=10)
    assert finished.status_code == 200, finished.text


def test_amr_after_a_password_and_a_second_factor(service):
    user, totp, recovery_codes = with_totp(service)
    rp = first_party(service)
    browser = Browser(service)
    asked = rp.authorize(browser)
    # The next step's code: this step's was used to turn TOTP on, and a code is accepted once.
    second_step(browser, user["email"], code=totp.at(time.time() + 30))
    assert amr_of(rp, Answer(browser.go(asked.sign_in_next))) == ["pwd", "otp", "mfa"]

    by_recovery = Browser(service)
    asked = rp.authorize(by_recovery)
    second_step(by_recovery, user["email"], recovery_code=recovery_codes[0])
    assert amr_of(rp, Answer(by_recovery.go(asked.sign_in_next))) == ["pwd", "mfa"]


def test_amr_after_a_passkey(service):
    """Passkeys live at a domain name (browsers take no IP address for them): this browser is at localhost."""
    user = service.new_user()
    named = service.url.replace("127.0.0.1", "localhost")
    body = {"email": user["email"], "password": DEFAULT_PASSWORD, "transport": "body"}
    token = service.call("POST", "/auth/login", json=body).json()["access_token"]
    passkey = Authenticator(origin=named, rp_id="localhost")
    options = requests.post(f"{named}/auth/passkeys/register/options", headers=bearer(token), timeout=10).json()
    added = requests.post(
        f"{named}/auth/passkeys", json={"credential": passkey.create(options["options"])}, headers=bearer(token)
    )
    assert added.status_code == 201, added.text

    rp = first_party(service)
    browser = Browser(service)
    asked = Answer(browser.go(rp.authorization_url().replace(service.url, named)))
    started = browser.post(f"{named}/auth/passkeys/login/options", timeout=10).json()
    login = {"login_id": started["login_id"], "credential": passkey.get(started["options"]), "transport": "cookie"}
    assert browser.post(f"{named}/auth/passkeys/login", json=login, timeout=10).status_code == 200
    assert amr_of(rp, Answer(browser.go(named + asked.sign_in_next))) == ["hwk", "user"]


def test_amr_after_another_provider_and_the_way_back_through_its_login(service):
    """The page's provider link carries the request as `next`: the provider's login comes back into it."""
    user = service.new_user()
    rp = first_party(service)
    browser = Browser(service)
    asked = rp.authorize(browser)
    url = browser.go("/auth/oauth/test/login", params={"next": asked.sign_in_next}).headers["Location"]
    while not url.startswith(service.url):  # the provider's own sign-in and consent screens
        answer = browser.get(url, allow_redirects=False, timeout=10)
        if answer.status_code in (302, 303):
            url = urljoin(url, answer.headers["Location"])
            continue
        action = re.search(r'<form[^>]*action="([^"]+)"', answer.text).group(1)
        fields = form_fields(answer.text)
        if "login" in fields:
            fields.update(login=user["email"], password="anything")
        url = urljoin(url, browser.post(urljoin(url, action), data=fields, allow_redirects=False).headers["Location"])
    landing = browser.go(url)  # the callback: the session's cookies, then a page of ours that moves on
    assert landing.status_code == 302 and landing.headers["Location"].startswith("/auth/oauth/landing?")
    page = browser.go(landing.headers["Location"])
    target = re.search(r'url=([^"]+)"', page.text).group(1).replace("&amp;", "&")
    assert target == asked.sign_in_next
    assert amr_of(rp, Answer(browser.go(target))) == ["fed"]


@pytest.fixture
def page(browser):
    context = browser.new_context()
    context.set_default_timeout(10_000)
    yield context.new_page()
    context.close()


@pytest.fixture
def callback():
    """An application's redirect URI on loopback: records each request's path and query, answers 200."""
    arrived: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):  # noqa: N802 - the name http.server calls
            arrived.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/callback", arrived
    server.shutdown()
    server.server_close()


def test_the_page_goes_on_to_an_authorization_request_and_nowhere_else(service, page, callback):
    user = service.new_user()
    redirect_uri, arrived = callback
    client, secret = service.new_client(first_party=True, redirect_uris=(redirect_uri,))
    rp = RelyingParty(service, client, secret, "openid")

    def sign_in_at(address: str) -> None:
        page.goto(address)
        page.get_by_label("E-mail", exact=True).fill(user["email"])
        page.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
        page.get_by_role("button", name="Log in", exact=True).click()

    for elsewhere in ("https://evil.example/", "//evil.example/oauth/authorize?x=1", "/\\evil.example/oauth/authorize"):
        sign_in_at(service.url + "/?" + requests.compat.urlencode({"next": elsewhere}))
        expect(page.locator("#status")).to_have_text(f"Logged in as {user['email']}")
        assert page.url == service.url + "/" and not arrived
        page.get_by_role("button", name="Log out", exact=True).click()
        expect(page.get_by_role("button", name="Log in", exact=True)).to_be_visible()

    asked = rp.authorize(Browser(service))  # where the authorization endpoint sends a browser without a session
    sign_in_at(service.url + asked.location)
    expect(page).to_have_url(re.compile("^" + re.escape(redirect_uri) + r"\?code="))
    assert "iss=" in arrived[-1] and f"state={rp.state}" in arrived[-1]


def test_the_page_lists_the_applications_allowed_and_withdraws_one(service, page):
    user = service.new_user()
    client, secret = service.new_client(name="Corner Shop")
    browser = Browser(service)
    rp = RelyingParty(service, client, secret, "openid email")
    token = authorized(rp, browser, user["email"])

    page.goto(service.url + "/")
    page.get_by_label("E-mail", exact=True).fill(user["email"])
    page.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
    page.get_by_role("button", name="Log in", exact=True).click()
    allowed = page.locator(f"#consents li[data-client-id='{client.client_id}']")
    expect(allowed).to_contain_text("Corner Shop")
    expect(allowed).to_contain_text("email, openid")
    expect(page.locator(f"#sessions li[data-session-id='{rp.verified_id_token(token)['sid']}']")).to_be_visible()
    allowed.get_by_role("button", name="Withdraw").click()
    expect(page.locator("#consents li")).to_have_count(0)
    expect(page.locator("#consents-empty")).to_be_visible()
    assert browser.go("/auth/consents").json() == {"consents": []}
    assert service.introspect(token["access_token"]) == {"active": False}  # its session ended with it
