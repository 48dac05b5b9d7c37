"""The authorization code flow, driven by an independent relying party (Authlib's requests client, PKCE S256) against
a live gunicorn, a browser signing in on the service's page and answering its consent page, ID tokens verified
against the published JWKS by PyJWT.

One service per module; each test has its own users and clients.
"""

from __future__ import annotations

import base64
import hashlib
import time

import pytest

from tests.oidc_provider.flows_support import (
    Browser,
    RelyingParty,
    consent,
    secure_cookies_to_loopback,  # noqa: F401 - a module-scoped autouse fixture
    sign_in_and_come_back,
    start_service,
)
from tests.utils import bearer


@pytest.fixture(scope="module")
def service(base_env, tmp_path_factory):
    running = start_service(base_env, tmp_path_factory.mktemp("oidc-flows"))
    yield running
    running.web.stop()


def at_hash(access_token: str) -> str:
    digest = hashlib.sha256(access_token.encode()).digest()
    return base64.urlsafe_b64encode(digest[:16]).rstrip(b"=").decode()


def test_a_relying_party_signs_a_user_in_by_discovery(service):
    client, secret = service.new_client()
    user = service.new_user()
    rp = RelyingParty(service, client, secret, "openid email profile offline_access")
    browser = Browser(service)

    asked = rp.authorize(browser)
    page = sign_in_and_come_back(browser, asked, user["email"])
    assert page.consent_page and client.name in page.response.text
    done = consent(browser, page)
    assert done.at_client, (done.response.status_code, done.location, done.response.text[:300])
    assert done.params["iss"] == service.discovery["issuer"] and done.params["state"] == rp.state

    token = rp.redeem(done)
    assert token["token_type"] == "Bearer" and token["expires_in"] == 900 and token["refresh_token"]
    claims = rp.verified_id_token(token)
    assert claims["sub"] == user["id"] and claims["nonce"] == rp.nonce and claims["amr"] == ["pwd"]
    assert claims["at_hash"] == at_hash(token["access_token"])
    assert claims["email"] == user["email"] and claims["preferred_username"] == user["email"].split("@")[0]
    assert abs(claims["auth_time"] - time.time()) < 60

    info = service.call("GET", "/oauth/userinfo", headers=bearer(token["access_token"]))
    assert info.status_code == 200, info.text
    assert info.json()["sub"] == user["id"] and info.json()["email"] == user["email"]
    listed = browser.go("/auth/sessions").json()["sessions"]
    assert any(session["id"] == claims["sid"] and session["device"] == client.name for session in listed)
