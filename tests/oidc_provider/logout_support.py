"""What the logout tests share: client sessions by the real flow, ID-token hints, and logout tokens checked as a
relying party would."""

from __future__ import annotations

import secrets
import time
from urllib.parse import parse_qs, urlsplit

import jwt
import requests
from authlib.integrations.requests_client import OAuth2Session

from app.oidc import keys
from app.oidc.issuer import issuer

EVENT = "http://schemas.openid.net/event/backchannel-logout"


def authorize(service_url: str, client: dict, secret: str, access_cookie: str) -> dict:
    """A client session made by the real flow: a browser signed in on the page (its access cookie) at the
    authorization endpoint (a first-party client: no consent asked), and the code redeemed by Authlib's client with
    PKCE S256. The token answer, with the ID token's claims (verified against the JWKS) as `claims`."""
    discovery = requests.get(service_url + "/.well-known/openid-configuration", timeout=10).json()
    rp = OAuth2Session(
        client["client_id"],
        secret,
        scope="openid email offline_access",
        redirect_uri=client["redirect_uris"][0],
        code_challenge_method="S256",
        token_endpoint_auth_method="client_secret_basic",
    )
    verifier = secrets.token_urlsafe(48)
    url, state = rp.create_authorization_url(discovery["authorization_endpoint"], code_verifier=verifier)
    # The cookie is Secure; requests keeps such cookies from http://127.0.0.1, so the browser's is given by hand.
    answer = requests.get(url, headers={"Cookie": f"__Host-access={access_cookie}"}, allow_redirects=False, timeout=10)
    location = answer.headers.get("Location", "")
    assert answer.status_code == 302 and location.startswith(client["redirect_uris"][0]), (answer.status_code, location)
    assert parse_qs(urlsplit(location).query)["state"] == [state]
    token = rp.fetch_token(discovery["token_endpoint"], authorization_response=location, code_verifier=verifier)
    header = jwt.get_unverified_header(token["id_token"])
    key = jwt.PyJWKSet.from_dict(requests.get(discovery["jwks_uri"], timeout=10).json())[header["kid"]]
    claims = jwt.decode(
        token["id_token"], key.key, algorithms=[key.algorithm_name], audience=client["client_id"],
        issuer=discovery["issuer"],
    )  # fmt: skip
    return {**token, "claims": claims}


def id_token(app, user_id: str, client_id: str, session_id: str, age: float = 0.0, **claims) -> str:
    """An ID token of this provider for a client session (`age` seconds old: 900 s and more is expired)."""
    with app.app_context():
        now = int(time.time() - age)
        fields = {"iss": issuer(), "sub": user_id, "aud": client_id, "sid": session_id, "iat": now, "exp": now + 900}
        return keys.sign({**fields, "auth_time": now, **claims})


def logout_token_of(body: bytes) -> str:
    """The logout token of a back-channel POST's form body (the only field)."""
    form = parse_qs(body.decode(), strict_parsing=True)
    assert list(form) == ["logout_token"] and len(form["logout_token"]) == 1, form
    return form["logout_token"][0]


def verified_logout_claims(token: str, jwks: dict, issuer_url: str, client_id: str) -> dict:
    """A logout token checked as Back-Channel Logout 1.0 asks a relying party to (PyJWT, the published JWKS)."""
    header = jwt.get_unverified_header(token)
    assert header["typ"] == "logout+jwt"
    key = jwt.PyJWKSet.from_dict(jwks)[header["kid"]]
    claims = jwt.decode(
        token,
        key.key,
        algorithms=[key.algorithm_name],
        audience=client_id,
        issuer=issuer_url,
        options={"require": ["iss", "aud", "iat", "exp", "jti", "sub", "sid", "events"]},
    )
    assert claims["events"] == {EVENT: {}}
    assert "nonce" not in claims
    assert 0 < claims["exp"] - claims["iat"] <= 300
    return claims
