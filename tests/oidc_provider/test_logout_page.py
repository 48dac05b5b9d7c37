"""`GET /oauth/logout` (RP-Initiated Logout 1.0): a valid hint with a registered URI ends that client session and
goes back with `state`; anything else asks the user on a page with its own anti-forgery field; no request sends
the browser to a URI that is not registered for the client, and no forged answer ends anything."""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from app.auth.sessions import session_exists
from app.oidc import clients, keys
from app.oidc.issuer import issuer
from app.oidc.logout import FORM_COOKIE
from tests.conftest import https_client
from tests.oidc_provider.logout_support import id_token
from tests.utils import parse_set_cookies

BYE = "https://shop.example/bye"
EVIL = "https://evil.example/phish"


@dataclass(frozen=True)
class Shop:
    """The registered client, as its relying party knows it."""

    client_id: str
    name: str
    redirect_uris: tuple[str, ...]
    secret: str


@pytest.fixture
def shop(app):
    """A registered first-party client (no consent page) with two post-logout URIs; `secret` beside it."""
    asked = clients.OAuthClient(
        client_id="",
        name="Corner Shop",
        type="confidential",
        redirect_uris=("https://shop.example/cb",),
        post_logout_redirect_uris=(BYE, "https://shop.example/bye?lang=en"),
        first_party=True,
    )
    with app.app_context():
        made, secret = clients.create_client(asked)
    return Shop(made.client_id, made.name, made.redirect_uris, secret)


def authorize(app, browser, shop) -> dict:
    """The signed-in browser authorizes the client, and the client redeems the code with PKCE: the token answer."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    asked = {
        "response_type": "code",
        "client_id": shop.client_id,
        "redirect_uri": shop.redirect_uris[0],
        "scope": "openid",
        "state": "st",
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    answer = browser.get("/oauth/authorize?" + urlencode(asked))
    assert answer.status_code == 302, answer.get_data(as_text=True)[:300]
    code = parse_qs(urlsplit(answer.headers["Location"]).query)["code"][0]
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": shop.redirect_uris[0]}
    basic = base64.b64encode(f"{shop.client_id}:{shop.secret}".encode()).decode()
    token = https_client(app).post(
        "/oauth/token", data={**form, "code_verifier": verifier}, headers={"Authorization": f"Basic {basic}"}
    )
    assert token.status_code == 200, token.get_json()
    return token.get_json()


@pytest.fixture
def browser(app, client, auth):
    """A user signed in on this browser (cookies) and a client session it authorized (the real flow)."""

    def make(shop) -> dict:
        user = auth.register()
        signed_in = auth.login(user["email"], transport="cookie")
        assert signed_in.status_code == 200
        token = authorize(app, client, shop)
        found = {"id": user["id"], "email": user["email"], "session_id": signed_in.get_json()["session_id"]}
        return {**found, "client_session": sid_of(app, token, shop), "id_token": token["id_token"]}

    return make


def another_browser(app, user: dict, shop) -> str:
    """The same user signs in on another browser and authorizes the client there: that client session's id."""
    elsewhere = https_client(app)
    login = {"email": user["email"], "password": "correct horse battery", "transport": "cookie"}
    assert elsewhere.post("/auth/login", json=login).status_code == 200
    return sid_of(app, authorize(app, elsewhere, shop), shop)


def sid_of(app, token: dict, shop) -> str:
    """The client session an ID token names."""
    with app.app_context():
        return keys.verify(token["id_token"], typ=None, audience=shop.client_id)["sid"]


def alive(app, user_id: str, session_id: str) -> bool:
    with app.app_context():
        return session_exists(user_id, session_id)


def logout_url(**params) -> str:
    return "/oauth/logout?" + urlencode(params)


def form_token(page: str) -> str:
    marker = 'name="form_token" value="'
    return page[page.index(marker) + len(marker) :].split('"', 1)[0]


def hidden_fields(page: str) -> dict[str, str]:
    fields = {}
    for chunk in page.split('<input type="hidden" name="')[1:]:
        name, rest = chunk.split('" value="', 1)
        fields[name] = rest.split('"', 1)[0]
    return fields


# ---- With a valid hint and a registered URI: done at once ----


@pytest.mark.parametrize(
    "registered, state, age, location",
    [
        (BYE, "xyz 1", 0, BYE + "?state=xyz+1"),
        ("https://shop.example/bye?lang=en", "s", 0, "https://shop.example/bye?lang=en&state=s"),
        (BYE, None, 3600, BYE),  # an expired ID token still names its session
    ],
)
def test_a_valid_hint_ends_that_client_session_and_goes_back_with_state(
    app, client, shop, browser, registered, state, age, location
):
    user = browser(shop)
    other = sid_of(app, authorize(app, client, shop), shop)
    hint = id_token(app, user["id"], shop.client_id, user["client_session"], age=age) if age else user["id_token"]
    params = {"id_token_hint": hint, "post_logout_redirect_uri": registered, **({"state": state} if state else {})}

    answer = client.get(logout_url(**params))

    assert answer.status_code == 302 and answer.headers["Location"] == location
    assert answer.headers["Cache-Control"] == "no-store"
    assert not alive(app, user["id"], user["client_session"])
    # Only that session: the browser's own and the client's other session stay.
    assert alive(app, user["id"], user["session_id"]) and alive(app, user["id"], other)


def test_a_valid_hint_without_a_uri_ends_the_session_and_says_so(app, client, shop, browser):
    user = browser(shop)
    answer = client.post("/oauth/logout", data={"id_token_hint": user["id_token"], "client_id": shop.client_id})
    assert answer.status_code == 200 and answer.mimetype == "text/html"
    assert "You are logged out of <strong>Corner Shop</strong>" in answer.get_data(as_text=True)
    assert not alive(app, user["id"], user["client_session"]) and alive(app, user["id"], user["session_id"])


def forged_hints(app, user: dict, shop) -> dict[str, str]:
    """ID tokens this service did not issue for this client session, each wrong in one way."""
    with app.app_context():
        kid = keys.signing_key().kid
        now = int(time.time())
        claims = {
            "iss": issuer(),
            "sub": user["id"],
            "aud": shop.client_id,
            "sid": user["client_session"],
            "iat": now,
            "exp": now + 900,
        }
        other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        return {
            "another key": jwt.encode(claims, other_key, algorithm="RS256", headers={"kid": kid}),
            "alg none": jwt.encode(claims, None, algorithm="none", headers={"kid": kid}),
            "another issuer": keys.sign({**claims, "iss": "https://other.example"}),
            "an access token": keys.sign(claims, typ="at+jwt"),
            "no sid": keys.sign({k: v for k, v in claims.items() if k != "sid"}),
            "not a JWT": "not.a.jwt",
        }


def test_a_hint_this_service_did_not_issue_is_refused_by_a_page(app, client, shop, browser):
    user = browser(shop)
    hints = forged_hints(app, user, shop)
    good = user["id_token"]
    cases = {
        **{name: {"id_token_hint": hint} for name, hint in hints.items()},
        "another client's id": {"id_token_hint": good, "client_id": "cl_" + "0" * 32},
        "an unknown client": {"client_id": "cl_" + "1" * 32},
        "a malformed client id": {"client_id": "shop"},
        "a control character": {"id_token_hint": good, "state": "a\x00b"},
    }
    for name, params in cases.items():
        answer = client.get(logout_url(**{"post_logout_redirect_uri": BYE, "state": "s", **params}))
        page = answer.get_data(as_text=True)
        assert answer.status_code == 400 and answer.mimetype == "text/html", name
        assert "Location" not in answer.headers and "cannot be acted on" in page, name
        assert "form-action 'self'" in answer.headers["Content-Security-Policy"], name
    assert alive(app, user["id"], user["client_session"]) and alive(app, user["id"], user["session_id"])


# ---- Otherwise the user is asked ----


def test_without_a_hint_the_user_is_asked_and_log_out_ends_this_browser_and_what_it_authorized(
    app, client, shop, browser
):
    user = browser(shop)
    elsewhere = another_browser(app, user, shop)

    question = client.get(logout_url(client_id=shop.client_id, post_logout_redirect_uri=BYE, state="st"))

    page = question.get_data(as_text=True)
    assert question.status_code == 200 and question.mimetype == "text/html"
    assert "Corner Shop" in page and ">Log out</button>" in page and ">Stay signed in</button>" in page
    # Its answer is redirected to the registered URI: the page's form-action allows that origin, no other.
    policy = question.headers["Content-Security-Policy"]
    assert policy.endswith("form-action 'self' https://shop.example") and "frame-ancestors 'none'" in policy
    assert question.headers["Referrer-Policy"] == "same-origin"  # so a browser's POST names its Origin (not null)
    cookie = parse_set_cookies(question.headers.getlist("Set-Cookie"))[FORM_COOKIE]
    assert cookie["value"] == form_token(page)
    assert {"secure", "httponly"} <= set(cookie) and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert alive(app, user["id"], user["session_id"])  # asking ends nothing

    answer = client.post("/oauth/logout", data={**hidden_fields(page), "action": "logout"})

    assert answer.status_code == 302 and answer.headers["Location"] == BYE + "?state=st"
    assert not alive(app, user["id"], user["session_id"]) and not alive(app, user["id"], user["client_session"])
    assert alive(app, user["id"], elsewhere)  # authorized from another browser: not this one's to end
    cleared = parse_set_cookies(answer.headers.getlist("Set-Cookie"))
    assert cleared["__Host-access"]["value"] == "" and cleared["__Secure-refresh"]["value"] == ""


def test_stay_signed_in_ends_nothing(app, client, shop, browser):
    user = browser(shop)
    page = client.get(logout_url(client_id=shop.client_id, post_logout_redirect_uri=BYE, state="st")).get_data(
        as_text=True
    )
    answer = client.post("/oauth/logout", data={**hidden_fields(page), "action": "stay"})
    assert answer.status_code == 302 and answer.headers["Location"] == BYE + "?state=st"
    assert alive(app, user["id"], user["session_id"]) and alive(app, user["id"], user["client_session"])


def test_a_uri_that_is_not_registered_is_never_followed(app, client, shop, browser):
    user = browser(shop)
    hint = user["id_token"]
    for params in ({"id_token_hint": hint}, {"client_id": shop.client_id}, {}):
        question = client.get(logout_url(**params, post_logout_redirect_uri=EVIL, state="st"))
        page = question.get_data(as_text=True)
        assert question.status_code == 200 and "evil.example" not in page, params
        assert question.headers["Content-Security-Policy"].endswith("form-action 'self'"), params
        assert alive(app, user["id"], user["client_session"]), params  # the hint alone does not end it unasked

    answer = client.post("/oauth/logout", data={**hidden_fields(page), "action": "logout"})
    assert answer.status_code == 200 and "Location" not in answer.headers
    assert "You are logged out" in answer.get_data(as_text=True)
    assert not alive(app, user["id"], user["session_id"])


def test_an_answer_not_from_this_browsers_page_ends_nothing(app, client, shop, browser):
    """Another site cannot answer for the user: its form token is not the one in this browser's cookie (and a
    cross-site POST carrying the session cookies is refused before that)."""
    user = browser(shop)
    hint = user["id_token"]
    asked = logout_url(id_token_hint=hint, post_logout_redirect_uri=EVIL)
    page = client.get(asked).get_data(as_text=True)
    fields = {**hidden_fields(page), "action": "logout"}

    held = form_token(page)
    for token in ("", "x" * 43, held[:-1] + ("B" if held.endswith("A") else "A")):
        refused = client.post("/oauth/logout", data={**fields, "form_token": token})
        assert refused.status_code == 403 and refused.mimetype == "text/html", token
    cross_site = client.post("/oauth/logout", data=fields, headers={"Origin": "https://evil.example"})
    assert cross_site.status_code == 403 and cross_site.get_json()["error"]["code"] == "csrf_rejected"
    client.delete_cookie(FORM_COOKIE, domain="localhost")
    assert client.post("/oauth/logout", data=fields).status_code == 403
    assert alive(app, user["id"], user["session_id"]) and alive(app, user["id"], user["client_session"])

    # The same answer from this browser's own page (its cookie back) is acted on.
    client.get(asked)
    page = client.get(asked).get_data(as_text=True)
    assert client.post("/oauth/logout", data={**hidden_fields(page), "action": "logout"}).status_code == 200
    assert not alive(app, user["id"], user["session_id"]) and not alive(app, user["id"], user["client_session"])
