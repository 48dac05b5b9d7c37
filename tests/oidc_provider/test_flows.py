"""The authorization code flow, driven by an independent relying party (Authlib's requests client, PKCE S256) against
a live gunicorn, a browser signing in on the service's page and answering its consent page, ID tokens verified
against the published JWKS by PyJWT.

One service per module; each test has its own users and clients. Tests of request checks alone run on one Redis;
those that store (codes, consents, client sessions) run on the cluster too.
"""

from __future__ import annotations

import base64
import hashlib
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import pytest
from authlib.integrations.base_client import OAuthError

from tests.oidc_provider.flows_support import (
    REDIRECT_URI,
    Answer,
    Browser,
    RelyingParty,
    authorized,
    consent,
    secure_cookies_to_loopback,  # noqa: F401 - a module-scoped autouse fixture
    sign_in_and_come_back,
    start_service,
)
from tests.utils import bearer

REQUEST_CHECKS = pytest.mark.not_on_cluster("checks of the request alone: the same code whatever the Redis")
OTHER_REDIRECT = "https://rp.example/other"


@pytest.fixture(scope="module")
def service(base_env, tmp_path_factory):
    running = start_service(base_env, tmp_path_factory.mktemp("oidc-flows"))
    yield running
    running.web.stop()


def at_hash(access_token: str, id_token: str) -> str:
    """The left half of the access token's hash by the ID token's algorithm's hash (OpenID Connect Core 3.1.3.6):
    SHA-256 for RS256 and ES256, SHA-512 for EdDSA with Ed25519."""
    algorithm = jwt.get_unverified_header(id_token)["alg"]
    digest = (hashlib.sha512 if algorithm == "EdDSA" else hashlib.sha256)(access_token.encode()).digest()
    return base64.urlsafe_b64encode(digest[: len(digest) // 2]).rstrip(b"=").decode()


def refused_at_client(answer: Answer, rp: RelyingParty, error: str) -> None:
    """The error went back to the client with the request's state and the issuer (RFC 9207)."""
    assert answer.at_client, (answer.response.status_code, answer.location, answer.response.text[:200])
    assert answer.params["error"] == error, answer.params
    assert answer.params["state"] == rp.state
    assert answer.params["iss"] == rp.service.discovery["issuer"]
    assert "code" not in answer.params


def activity(browser: Browser, entry_type: str) -> list[dict]:
    page = browser.go("/auth/activity?limit=100").json()["entries"]
    return [entry for entry in page if entry["type"] == entry_type]


def test_a_relying_party_signs_a_user_in_by_discovery(service):
    client, secret = service.new_client()
    user = service.new_user()
    rp = RelyingParty(service, client, secret, "openid email profile offline_access")
    browser = Browser(service)

    url = rp.authorization_url()
    asked = Answer(browser.go(url))  # no browser session: to the page, which comes back to this very request
    assert asked.location == "/?" + urlencode({"next": url.removeprefix(service.url)})
    page = sign_in_and_come_back(browser, asked, user["email"])
    assert page.consent_page and client.name in page.response.text
    for scope in ("email", "profile", "offline_access"):
        assert f'data-scope="{scope}"' in page.response.text
    policy = page.response.headers["Content-Security-Policy"]
    assert "form-action 'self' https://rp.example;" in policy and "script-src 'self';" in policy
    assert page.response.headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in policy
    done = consent(browser, page)
    assert done.at_client, (done.response.status_code, done.location, done.response.text[:300])
    assert done.params["iss"] == service.discovery["issuer"] and done.params["state"] == rp.state

    token = rp.redeem(done)
    assert token["token_type"] == "Bearer" and token["expires_in"] == 900 and token["refresh_token"]
    assert set(token["scope"].split()) == {"openid", "email", "profile", "offline_access"}
    claims = rp.verified_id_token(token)
    assert claims["sub"] == user["id"] and claims["aud"] == client.client_id and claims["nonce"] == rp.nonce
    assert claims["amr"] == ["pwd"] and claims["at_hash"] == at_hash(token["access_token"], token["id_token"])
    assert claims["email"] == user["email"] and claims["email_verified"] is False
    assert claims["preferred_username"] == user["email"].split("@")[0]
    assert abs(claims["auth_time"] - time.time()) < 60 and claims["exp"] - claims["iat"] == 900

    # The session is one of the user's devices, named after the client, with the ID token's sid.
    listed = browser.go("/auth/sessions").json()["sessions"]
    assert [session["device"] for session in listed if session["id"] == claims["sid"]] == [client.name]
    (granted,) = [entry for entry in activity(browser, "login.succeeded") if entry["details"].get("client_id")]
    assert granted["details"]["client_id"] == client.client_id and granted["details"]["session_id"] == claims["sid"]
    (allowed,) = activity(browser, "consent.granted")
    assert allowed["details"] == {
        "client_id": client.client_id,
        "scopes": ["email", "offline_access", "openid", "profile"],
    }

    info = service.call("GET", "/oauth/userinfo", headers=bearer(token["access_token"]))
    assert info.status_code == 200 and info.headers["Cache-Control"] == "no-store"
    assert info.json() == {
        "sub": user["id"],
        "email": user["email"],
        "email_verified": False,
        "preferred_username": user["email"].split("@")[0],
    }
    introspected = service.introspect(token["access_token"])
    assert introspected["active"] is True and introspected["client_id"] == client.client_id
    assert introspected["sub"] == user["id"] and introspected["sid"] == claims["sid"]


def test_userinfo_answers_what_the_scope_allows(service):
    client, secret = service.new_client(first_party=True)
    user = service.new_user()
    browser = Browser(service)
    token = authorized(RelyingParty(service, client, secret, "openid"), browser, user["email"])
    assert "refresh_token" not in token  # no offline_access, no refresh token
    claims = RelyingParty(service, client, secret, "openid").verified_id_token(token)
    assert "email" not in claims and "preferred_username" not in claims
    by_post = service.call("POST", "/oauth/userinfo", headers=bearer(token["access_token"]))
    assert by_post.status_code == 200 and by_post.json() == {"sub": user["id"]}

    no_openid = authorized(RelyingParty(service, client, secret, "email"), browser, user["email"])
    refused = service.call("GET", "/oauth/userinfo", headers=bearer(no_openid["access_token"]))
    assert refused.status_code == 403 and refused.json()["error"] == "insufficient_scope"
    assert "id_token" not in no_openid  # no openid, no ID token: a plain OAuth 2.0 answer
    garbage = service.call("GET", "/oauth/userinfo", headers=bearer("not-a-token"))
    assert garbage.status_code == 401 and garbage.json()["error"] == "invalid_token"
    assert garbage.headers["WWW-Authenticate"].startswith("Bearer")


def test_a_code_works_once_and_a_second_use_revokes_what_the_first_gave(service):
    client, secret = service.new_client(first_party=True)
    user = service.new_user()
    rp = RelyingParty(service, client, secret, "openid offline_access")
    browser = Browser(service)
    answer = sign_in_and_come_back(browser, rp.authorize(browser), user["email"])
    assert answer.at_client  # first party: no consent page
    token = rp.redeem(answer)
    sid = rp.verified_id_token(token)["sid"]
    assert service.introspect(token["access_token"])["active"] is True

    with pytest.raises(OAuthError) as second:
        rp.redeem(answer)
    assert second.value.error == "invalid_grant"
    # Everything the first use gave is revoked: the access token, the refresh token, the session.
    assert service.introspect(token["access_token"]) == {"active": False}
    assert service.call("GET", "/oauth/userinfo", headers=bearer(token["access_token"])).status_code == 401
    with pytest.raises(OAuthError) as refresh:
        rp.session.refresh_token(service.discovery["token_endpoint"], refresh_token=token["refresh_token"])
    assert refresh.value.error == "invalid_grant"
    assert sid not in [session["id"] for session in browser.go("/auth/sessions").json()["sessions"]]
    # And a third use is refused too (the code is remembered as used).
    with pytest.raises(OAuthError):
        rp.redeem(answer)


def test_a_code_is_bound_to_its_client(service):
    client, secret = service.new_client(first_party=True)
    other, other_secret = service.new_client(first_party=True)
    user = service.new_user()
    rp = RelyingParty(service, client, secret, "openid")
    browser = Browser(service)
    answer = sign_in_and_come_back(browser, rp.authorize(browser), user["email"])
    thief = RelyingParty(service, other, other_secret, "openid")
    with pytest.raises(OAuthError) as stolen:
        thief.redeem(answer, code_verifier=rp.verifier)
    assert stolen.value.error == "invalid_grant"
    assert rp.redeem(answer)["access_token"]  # not burnt by the other client's attempt
    replayed = rp.authorize(browser, nonce=rp.nonce)  # a nonce serves one code
    refused_at_client(replayed, rp, "invalid_request")


@REQUEST_CHECKS
def test_pkce_with_s256_is_required_of_every_client(service):
    client, secret = service.new_client(first_party=True)
    user = service.new_user()
    browser = Browser(service)
    assert browser.sign_in(user["email"]).status_code == 200
    rp = RelyingParty(service, client, secret, "openid")

    without = Answer(browser.go(rp.authorization_url().split("&code_challenge")[0]))  # a confidential client too
    refused_at_client(without, rp, "invalid_request")
    url = rp.authorization_url()
    plain = url.replace("code_challenge_method=S256", "code_challenge_method=plain")
    refused_at_client(Answer(browser.go(plain)), rp, "invalid_request")
    no_method = url.replace("&code_challenge_method=S256", "")
    refused_at_client(Answer(browser.go(no_method)), rp, "invalid_request")

    answer = rp.authorize(browser)
    with pytest.raises(OAuthError) as mismatch:
        rp.redeem(answer, code_verifier="x" * 43)
    assert mismatch.value.error == "invalid_grant"
    answer = rp.authorize(browser)
    missing = service.call(
        "POST",
        "/oauth/token",
        data={"grant_type": "authorization_code", "code": answer.params["code"], "redirect_uri": REDIRECT_URI},
        auth=(client.client_id, secret),
    )
    assert missing.status_code == 400 and missing.json()["error"] == "invalid_request"
    assert rp.redeem(answer)["access_token"]  # a failed verifier burns nothing


@REQUEST_CHECKS
def test_an_unknown_client_or_redirect_uri_gets_a_page_and_is_never_redirected(service):
    client, secret = service.new_client(redirect_uris=(REDIRECT_URI, OTHER_REDIRECT), first_party=True)
    rp = RelyingParty(service, client, secret, "openid")
    browser = Browser(service)
    url = rp.authorization_url()
    cases = {
        "unknown client": url.replace(client.client_id, "cl_" + "0" * 32),
        "no client": url.replace(f"client_id={client.client_id}", "x=1"),
        "another redirect": url.replace("rp.example%2Fcallback", "evil.example%2Fcallback"),
        "a longer redirect": url.replace("%2Fcallback", "%2Fcallback%2F"),
        "a redirect with a query": url.replace("%2Fcallback", "%2Fcallback%3Fa%3D1"),
        "no redirect, two registered": url.replace("redirect_uri=https%3A%2F%2Frp.example%2Fcallback", "y=1"),
        "two redirects": url + "&redirect_uri=" + "https%3A%2F%2Frp.example%2Fcallback",
    }
    for case, asked in cases.items():
        answer = browser.go(asked)
        assert answer.status_code == 400 and "Location" not in answer.headers, case
        assert answer.headers["Content-Type"].startswith("text/html") and 'id="refused"' in answer.text, case

    # At the token endpoint: the redirect URI must be the one the code was issued for.
    user = service.new_user()
    answer = sign_in_and_come_back(browser, rp.authorize(browser), user["email"])
    with pytest.raises(OAuthError) as elsewhere:
        rp.redeem(answer, redirect_uri=OTHER_REDIRECT)
    assert elsewhere.value.error == "invalid_grant"


@REQUEST_CHECKS
def test_other_errors_go_back_to_the_client_with_state_and_iss(service):
    client, secret = service.new_client(scopes=("openid", "email"), first_party=True)
    rp = RelyingParty(service, client, secret, "openid")
    browser = Browser(service)
    refused_at_client(rp.authorize(browser, response_type="token"), rp, "unsupported_response_type")
    refused_at_client(rp.authorize(browser, response_type="code id_token"), rp, "unsupported_response_type")
    refused_at_client(rp.authorize(browser, scope="openid events"), rp, "invalid_scope")  # not registered for it
    refused_at_client(rp.authorize(browser, scope="openid admin"), rp, "invalid_scope")  # no such scope
    refused_at_client(rp.authorize(browser, prompt="none login"), rp, "invalid_request")
    refused_at_client(rp.authorize(browser, max_age="soon"), rp, "invalid_request")
    refused_at_client(Answer(browser.go(rp.authorization_url() + "&scope=email")), rp, "invalid_request")
    backend, backend_secret = service.new_client(grant_types=("client_credentials",))  # not for the code flow
    only_credentials = RelyingParty(service, backend, backend_secret, "openid")
    refused_at_client(only_credentials.authorize(browser), only_credentials, "unauthorized_client")


def test_consent_refused_remembered_narrowed_asked_again_and_withdrawn(service):
    client, secret = service.new_client()
    user = service.new_user()
    browser = Browser(service)
    rp = RelyingParty(service, client, secret, "openid email")
    page = sign_in_and_come_back(browser, rp.authorize(browser), user["email"])
    refused_at_client(consent(browser, page, "deny"), rp, "access_denied")
    assert browser.go("/auth/consents").json() == {"consents": []}

    token = authorized(rp, browser, user["email"])  # asked, allowed
    assert rp.authorize(browser).at_client  # the same scopes again: no page
    assert RelyingParty(service, client, secret, "openid").authorize(browser).at_client  # a subset: no page
    wider = RelyingParty(service, client, secret, "openid email profile")
    assert wider.authorize(browser).consent_page  # more than allowed: asked again
    assert rp.authorize(browser, prompt="consent").consent_page  # the client asks for the page
    (listed,) = browser.go("/auth/consents").json()["consents"]
    assert listed["client_id"] == client.client_id and listed["name"] == client.name
    assert listed["scopes"] == ["email", "openid"]
    assert browser.go(f"/auth/consents/{client.client_id}").json() == listed
    consent(browser, wider.authorize(browser))  # allowing more adds to what was allowed
    assert browser.go(f"/auth/consents/{client.client_id}").json()["scopes"] == ["email", "openid", "profile"]

    # Withdrawn: the client's sessions end, and the next request asks again.
    withdrawn = browser.go(f"/auth/consents/{client.client_id}", method="DELETE", headers={"Origin": service.url})
    assert withdrawn.status_code == 204
    assert browser.go(f"/auth/consents/{client.client_id}").status_code == 404
    assert browser.go(f"/auth/consents/{client.client_id}", method="DELETE").status_code == 404
    assert service.introspect(token["access_token"]) == {"active": False}
    assert rp.authorize(browser).consent_page
    (entry,) = activity(browser, "consent.withdrawn")
    assert entry["details"] == {"client_id": client.client_id}
    # Another user's consent is theirs alone; a stranger's client id is 404.
    other = Browser(service)
    assert other.sign_in(service.new_user()["email"]).status_code == 200
    assert other.go(f"/auth/consents/{client.client_id}").status_code == 404
    assert browser.go("/auth/consents/not-a-client").status_code == 404


def test_a_foreign_consent_form_is_refused(service):
    client, secret = service.new_client()
    browser, other = Browser(service), Browser(service)
    user = service.new_user()
    rp = RelyingParty(service, client, secret, "openid email")
    page = sign_in_and_come_back(browser, rp.authorize(browser), user["email"])
    assert other.sign_in(user["email"]).status_code == 200  # the same user, another browser session
    stolen = consent(other, page)  # the form's anti-forgery value is the first browser's
    assert stolen.response.status_code == 403 and "Location" not in stolen.response.headers
    cross_site = browser.go(
        page.response.text.split('action="', 1)[1].split('"', 1)[0].replace("&amp;", "&"),
        method="POST",
        data={"decision": "allow"},
        headers={"Origin": "https://evil.example"},
    )
    assert cross_site.status_code == 403 and cross_site.json()["error"]["code"] == "csrf_rejected"
    assert browser.go("/auth/consents").json() == {"consents": []}


@REQUEST_CHECKS
def test_prompt_none_never_shows_a_page(service):
    client, secret = service.new_client()
    user = service.new_user()
    browser = Browser(service)
    rp = RelyingParty(service, client, secret, "openid email")
    refused_at_client(rp.authorize(browser, prompt="none"), rp, "login_required")
    assert browser.sign_in(user["email"]).status_code == 200
    refused_at_client(rp.authorize(browser, prompt="none"), rp, "consent_required")
    scopeless = RelyingParty(service, client, secret, None)  # would still learn who signed in: asked too
    refused_at_client(scopeless.authorize(browser, prompt="none"), scopeless, "consent_required")
    consent(browser, rp.authorize(browser))
    assert scopeless.authorize(browser, prompt="none").at_client  # allowed once: nothing more to ask
    silent = rp.authorize(browser, prompt="none")
    assert silent.at_client and "code" in silent.params
    assert rp.verified_id_token(rp.redeem(silent))["sub"] == user["id"]
    refused_at_client(rp.authorize(browser, prompt="none", max_age="0"), rp, "login_required")


@REQUEST_CHECKS
def test_prompt_login_and_an_exceeded_max_age_ask_for_a_new_sign_in(service):
    client, secret = service.new_client(first_party=True)
    user = service.new_user()
    browser = Browser(service)
    rp = RelyingParty(service, client, secret, "openid")
    first = rp.verified_id_token(authorized(rp, browser, user["email"]))
    assert rp.authorize(browser, max_age="3600").at_client  # a recent enough sign-in

    for asked in ({"prompt": "login"}, {"max_age": "0"}, {"prompt": "login consent"}):
        again = rp.authorize(browser, **asked)
        assert again.sign_in_next is not None and parse_qs(urlsplit(again.location).query)["reauth"] == ["1"]
        kept = parse_qs(urlsplit(again.sign_in_next).query)
        assert "max_age" not in kept and "login" not in kept.get("prompt", [""])[0]  # asked once, not in a loop
        assert kept["nonce"] == [rp.nonce] and kept["code_challenge"]
        signed_in_before = browser.go("/auth/me").json()["session_id"]
        answer = sign_in_and_come_back(browser, again, user["email"])
        assert answer.at_client, (answer.response.status_code, answer.location)
        assert browser.go("/auth/me").json()["session_id"] != signed_in_before  # a new sign-in, a new session
        later = rp.verified_id_token(rp.redeem(answer))
        assert later["auth_time"] >= first["auth_time"]  # whole seconds: the same second is possible
        first = later


@REQUEST_CHECKS
def test_hostile_values_are_refused_cleanly(service):
    """Quotes, backslashes, control characters, other scripts and odd digits in every parameter: a page or an
    error at the client, never a 500 (the suite checks the server's log for tracebacks at its end)."""
    client, secret = service.new_client(first_party=True)
    user = service.new_user()
    browser = Browser(service)
    assert browser.sign_in(user["email"]).status_code == 200
    rp = RelyingParty(service, client, secret, "openid")
    hostile = ['a"b', "a\\b", "\u00e9\u4e2d", "\u00b2", "\u0000x", "x" * 3000, "%", "<script>"]
    for name in ("response_type", "scope", "state", "prompt", "nonce", "max_age", "code_challenge", "redirect_uri"):
        for value in hostile:
            answer = browser.go(rp.authorization_url(), params={name: value})
            assert answer.status_code in (302, 400), (name, value, answer.status_code)
    for value in hostile:
        form = {"grant_type": "authorization_code", "code": value, "code_verifier": value, "redirect_uri": value}
        answer = service.call("POST", "/oauth/token", data=form, auth=(client.client_id, secret))
        assert answer.status_code == 400, (value, answer.text)
        form = {"grant_type": "refresh_token", "refresh_token": value, "scope": value}
        assert service.call("POST", "/oauth/token", data=form, auth=(client.client_id, secret)).status_code == 400
        revoked = service.call("POST", "/oauth/revoke", data={"token": value}, auth=(client.client_id, secret))
        assert revoked.status_code == 200, (value, revoked.text)
        if value.isascii() and value.isprintable():  # what a header can carry
            answer = service.call("GET", "/oauth/userinfo", headers={"Authorization": f"Bearer {value}"})
            assert answer.status_code == 401, (value, answer.text)
