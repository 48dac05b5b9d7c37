"""Log in with this service, in real Chromium: a second web application on loopback (a small relying party served
by the test) signs its user in through this service's authorization endpoint (password and TOTP on the service's
page, the consent page clicked), shows who signed in, and is logged out by back-channel logout when the user
presses "Log out everywhere" on the service's page. nginx, gunicorn, Redis and the delivery process are real.

The relying party is what any web application would be: Authlib's requests client for the code flow (PKCE S256),
PyJWT for the ID token and the logout token (both against the published JWKS), and its own session cookie.
"""

from __future__ import annotations

import html
import secrets
import threading
import time
from urllib.parse import urlencode

import jwt
import pyotp
import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from playwright.sync_api import expect
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from app import create_app
from app.auth.users import create_user
from app.oidc import clients
from tests.browser.conftest import Stack
from tests.outgoing.receivers import DeliveryProcess
from tests.servers import free_port, wait_until
from tests.utils import DEFAULT_PASSWORD, bearer, random_email

pytestmark = pytest.mark.not_on_cluster("a browser test of the flows and logouts proved on both modes elsewhere")

LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
# The relying party's back-channel URI is on loopback, over plain HTTP; the service must be allowed to call it.
LOOPBACK_CALLS = {
    "WEBHOOK_OUT_ALLOW_PRIVATE": "true",
    "WEBHOOK_OUT_ALLOW_HTTP": "true",
    "WEBHOOK_OUT_RETRY_SCHEDULE": "1,2",
    "WEBHOOK_OUT_TIMEOUT_SECONDS": "2",
    "WEBHOOK_OUT_CONNECT_TIMEOUT_SECONDS": "1",
}


class RelyingParty:
    """A web application that logs its users in with the service: `/` shows who is signed in, `/login` starts the
    code flow, `/callback` ends it, `/backchannel` takes logout tokens and drops the sessions they name, `/logout`
    drops its own session and sends the browser to the service's logout (no hint: the service asks the user),
    which sends it back to `/logged-out`."""

    def __init__(self, issuer: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.discovery = requests.get(issuer + "/.well-known/openid-configuration", timeout=10).json()
        self.client_id = self.secret = ""
        self.sessions: dict[str, dict] = {}  # cookie -> {"sub", "sid", "email"}
        self.pending: dict[str, dict] = {}  # state -> the code verifier and nonce of a login under way
        self.logouts: list[dict] = []  # the verified logout tokens' claims
        self.logout_states: set[str] = set()
        self.lock = threading.Lock()

    def start(self) -> RelyingParty:
        self.server = make_server("127.0.0.1", self.port, self.wsgi, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()

    def oauth(self) -> OAuth2Session:
        return OAuth2Session(
            self.client_id,
            self.secret,
            scope="openid email",
            redirect_uri=self.url + "/callback",
            code_challenge_method="S256",
            token_endpoint_auth_method="client_secret_basic",
        )

    def verified(self, token: str, typ: str | None = None, **options) -> dict:
        """A token of the provider, verified against its JWKS as a relying party must."""
        header = jwt.get_unverified_header(token)
        assert header.get("typ") == typ or (typ is None and header.get("typ") in (None, "JWT"))
        key = jwt.PyJWKSet.from_dict(requests.get(self.discovery["jwks_uri"], timeout=10).json())[header["kid"]]
        return jwt.decode(
            token,
            key.key,
            algorithms=[key.algorithm_name],
            audience=self.client_id,
            issuer=self.discovery["issuer"],
            **options,
        )

    @Request.application
    def wsgi(self, request: Request) -> Response:
        if request.path == "/login":
            return self.login()
        if request.path == "/callback":
            return self.callback(request)
        if request.path == "/backchannel" and request.method == "POST":
            return self.backchannel(request)
        if request.path == "/logout":
            return self.logout(request)
        if request.path == "/logged-out":
            known = request.args.get("state") in self.logout_states
            return Response(
                f'<p id="rp-status">Logged out{"" if known else " (unknown state)"}</p>', mimetype="text/html"
            )
        cookie = request.cookies.get("rp_session", "")
        with self.lock:
            signed_in = self.sessions.get(cookie)
        if signed_in:  # the page looks again every second, as an app polling its own session would
            refresh = '<meta http-equiv="refresh" content="1">'
            body = (
                f'{refresh}<p id="rp-status">Signed in as {html.escape(signed_in["email"])}</p>'
                '<p><a id="rp-logout" href="/logout">Log out</a></p>'
            )
        else:
            body = '<p id="rp-status">Signed out</p><p><a id="rp-login" href="/login">Log in with auth-rt</a></p>'
        return Response(f"<!doctype html><title>Relying party</title>{body}", mimetype="text/html")

    def login(self) -> Response:
        verifier, nonce = secrets.token_urlsafe(48), secrets.token_urlsafe(16)
        url, state = self.oauth().create_authorization_url(
            self.discovery["authorization_endpoint"], code_verifier=verifier, nonce=nonce
        )
        with self.lock:
            self.pending[state] = {"verifier": verifier, "nonce": nonce}
        return Response(status=302, headers={"Location": url})

    def logout(self, request: Request) -> Response:
        state = secrets.token_urlsafe(8)
        with self.lock:
            self.sessions.pop(request.cookies.get("rp_session", ""), None)
            self.logout_states.add(state)
        query = urlencode(
            {"client_id": self.client_id, "post_logout_redirect_uri": self.url + "/logged-out", "state": state}
        )
        return Response(status=302, headers={"Location": self.discovery["end_session_endpoint"] + "?" + query})

    def callback(self, request: Request) -> Response:
        with self.lock:
            pending = self.pending.pop(request.args.get("state", ""), None)
        if pending is None or "code" not in request.args:
            return Response("login failed", status=400)
        assert request.args.get("iss") == self.discovery["issuer"]  # RFC 9207: the answer names its issuer
        token = self.oauth().fetch_token(
            self.discovery["token_endpoint"],
            authorization_response=request.url,
            code_verifier=pending["verifier"],
            state=request.args["state"],
        )
        claims = self.verified(token["id_token"])
        assert claims["nonce"] == pending["nonce"]
        cookie = secrets.token_urlsafe(16)
        with self.lock:
            self.sessions[cookie] = {"sub": claims["sub"], "sid": claims["sid"], "email": claims["email"]}
        response = Response(status=302, headers={"Location": "/"})
        response.set_cookie("rp_session", cookie, httponly=True, samesite="Lax")
        return response

    def backchannel(self, request: Request) -> Response:
        try:
            claims = self.verified(
                request.form["logout_token"], typ="logout+jwt", options={"require": ["iat", "exp", "jti", "sid"]}
            )
        except (KeyError, jwt.PyJWTError):
            return Response(status=400)
        if claims.get("events") != {LOGOUT_EVENT: {}} or "nonce" in claims:
            return Response(status=400)
        with self.lock:
            self.logouts.append(claims)
            for cookie in [c for c, held in self.sessions.items() if held["sid"] == claims["sid"]]:
                del self.sessions[cookie]
        return Response(status=200)


@pytest.fixture(scope="module")
def stack(base_env, tmp_path_factory):
    """The service behind nginx, its issuer its own address, and the delivery process."""
    directory = tmp_path_factory.mktemp("oidc-login")
    running = Stack(base_env, directory, **LOOPBACK_CALLS)
    running.app.env["OIDC_ISSUER"] = running.url
    running.start()
    delivery = DeliveryProcess({**running.app.env}, directory / "worker.log").start()
    yield running
    delivery.stop()
    running.stop()


def start_relying_party(stack: Stack, base_env: dict, name: str, first_party: bool) -> RelyingParty:
    """A relying party, registered as a client."""
    party = RelyingParty(stack.url).start()
    app = create_app({**base_env, **LOOPBACK_CALLS, "OIDC_ISSUER": stack.url})
    asked = clients.OAuthClient(
        client_id="",
        name=name,
        type="confidential",
        redirect_uris=(party.url + "/callback",),
        scopes=("openid", "email"),
        post_logout_redirect_uris=(party.url + "/logged-out",),
        backchannel_logout_uri=party.url + "/backchannel",
        first_party=first_party,
    )
    with app.app_context():
        made, party.secret = clients.create_client(asked)
    party.client_id = made.client_id
    return party


@pytest.fixture(scope="module")
def relying_party(stack, base_env):
    """A client that is not first party: its users are asked for consent."""
    party = start_relying_party(stack, base_env, "Corner Shop", first_party=False)
    yield party
    party.stop()


@pytest.fixture(scope="module")
def own_app(stack, base_env):
    """One of the product's own applications (first party): no consent is asked."""
    party = start_relying_party(stack, base_env, "Back Office", first_party=True)
    yield party
    party.stop()


def user_with_totp(stack: Stack, base_env: dict) -> tuple[str, str]:
    """A user with TOTP on: e-mail and TOTP secret."""
    email = random_email()
    with create_app(base_env).app_context():
        create_user(email, DEFAULT_PASSWORD)
    login = requests.post(
        stack.url + "/auth/login", json={"email": email, "password": DEFAULT_PASSWORD, "transport": "body"}, timeout=10
    )
    token = login.json()["access_token"]
    setup = requests.post(stack.url + "/auth/mfa/totp/setup", headers=bearer(token), timeout=10)
    secret = setup.json()["secret"]
    confirmed = requests.post(
        stack.url + "/auth/mfa/totp/confirm", json={"code": pyotp.TOTP(secret).now()}, headers=bearer(token), timeout=10
    )
    assert confirmed.status_code == 200, confirmed.text
    requests.post(stack.url + "/auth/logout", headers=bearer(token), timeout=10)
    return email, secret


def test_a_second_web_app_logs_in_through_the_service_and_is_logged_out_by_back_channel(
    stack, base_env, relying_party, new_context
):
    email, secret = user_with_totp(stack, base_env)
    page = new_context().new_page()

    # The relying party sends the browser to the service, where the user signs in with password and TOTP.
    page.goto(relying_party.url + "/")
    expect(page.locator("#rp-status")).to_have_text("Signed out")
    page.locator("#rp-login").click()
    page.get_by_label("E-mail", exact=True).fill(email)
    page.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
    page.get_by_role("button", name="Log in", exact=True).click()
    # The next step's code (one step off is accepted): this step's was used to turn TOTP on.
    page.locator("#mfa-code").fill(pyotp.TOTP(secret).at(time.time() + 30))
    page.locator("#mfa-form").get_by_role("button", name="Continue").click()

    # The consent page names the client; the user allows, and is back at the relying party, signed in.
    expect(page.get_by_text("Corner Shop").first).to_be_visible()
    page.get_by_role("button", name="Allow", exact=True).click()
    expect(page).to_have_url(relying_party.url + "/")
    expect(page.locator("#rp-status")).to_have_text(f"Signed in as {email}")
    (held,) = relying_party.sessions.values()

    # On the service's page, "Log out everywhere": the relying party is told, and its page shows it.
    service = page.context.new_page()
    service.goto(stack.url + "/")
    expect(service.locator("#status")).to_have_text(f"Logged in as {email}")
    service.get_by_role("button", name="Log out everywhere").click()
    expect(service.get_by_role("button", name="Log in", exact=True)).to_be_visible()
    expect(page.locator("#rp-status")).to_have_text("Signed out", timeout=5_000)  # its page looks every second
    assert [claims["sid"] for claims in relying_party.logouts] == [held["sid"]]
    assert relying_party.logouts[0]["sub"] == held["sub"]


def test_a_web_app_sends_its_user_to_log_out_and_the_service_asks_first(stack, base_env, own_app, new_context):
    """RP-initiated logout without a hint: the service's page asks; "Log out" ends this browser's session here and
    the client session it authorized (told by back-channel), and the browser goes back to the registered URI."""
    email = random_email()
    with create_app(base_env).app_context():
        create_user(email, DEFAULT_PASSWORD)
    page = new_context().new_page()
    page.goto(own_app.url + "/login")
    page.get_by_label("E-mail", exact=True).fill(email)
    page.get_by_label("Password", exact=True).fill(DEFAULT_PASSWORD)
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page.locator("#rp-status")).to_have_text(f"Signed in as {email}")
    (held,) = own_app.sessions.values()

    page.locator("#rp-logout").click()
    expect(page.locator("#question")).to_contain_text("Back Office asks to log you out.")
    page.get_by_role("button", name="Log out", exact=True).click()

    expect(page.locator("#rp-status")).to_have_text("Logged out")
    assert page.url.startswith(own_app.url + "/logged-out?state=")
    wait_until(lambda: own_app.logouts, timeout=5, message="the back-channel logout")
    assert [(claims["sid"], claims["sub"]) for claims in own_app.logouts] == [(held["sid"], held["sub"])]
    page.goto(stack.url + "/")
    expect(page.get_by_role("button", name="Log in", exact=True)).to_be_visible()  # signed out here too
