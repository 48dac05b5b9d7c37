"""What the logout tests share: client sessions, ID-token hints, and logout tokens checked as a relying party would."""

from __future__ import annotations

import time
from urllib.parse import parse_qs

import jwt

from app.auth import sessions
from app.oidc import keys
from app.oidc.issuer import issuer
from app.redis import Keys, get_redis

EVENT = "http://schemas.openid.net/event/backchannel-logout"


def start_client_session(app, user_id: str, client_id: str, name: str, authorized_from: str | None = None) -> str:
    """A client session as redeeming an authorization code starts one (app/oidc/sessions.py `start`): the user
    among the client's, then a session of theirs (its device the client's name) in the user's client-session
    index, naming the client and the browser session it was authorized from."""
    with app.app_context():
        get_redis().sadd(Keys.client_users(client_id), user_id)
        grant = sessions.ClientGrant(client_id, authorized_from or "", "openid", time.time(), ("pwd",))
        login = {"method": "oidc", "client_id": client_id, "amr": ["pwd"]}
        return sessions.start_session(user_id, name, "127.0.0.1", login, client=grant).session_id


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
