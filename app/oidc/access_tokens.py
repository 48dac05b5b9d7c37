"""Access tokens issued to clients: JWTs of RFC 9068 (`typ: at+jwt`) signed with the provider's keys.

They are told apart from the service's own access tokens by their key: the service's are signed with JWT_SECRET
or JWT_PRIVATE_KEY and verified by app/auth/tokens.py, which refuses every other key; these are signed with a key
of the provider's JWKS and verified here, never there. So a client's token is refused (401) by every endpoint of
the service except those that ask for it: userinfo, introspection, and (scope `events`) the events endpoints.

A token is active while its signature, issuer, type and expiry hold, its client still exists (deleting a client
refuses its tokens at once), it was not revoked (a revoked token's `jti` is kept in Redis until the token would
have expired), and, for a user's token, its session (`sid`) still exists.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from authlib.oauth2.rfc6749.util import scope_to_list

from ..auth import sessions
from ..auth.guards import Caller
from ..errors import unauthorized
from ..redis import Keys, get_redis
from . import keys
from .clients import OAuthClient, get_client
from .issuer import issuer

TYPE = "at+jwt"
LIFETIME_SECONDS = 900
EVENTS_SCOPE = "events"


class TokenRefused(Exception):
    """A token that is not an active client access token (the message says why, for logs only)."""


class TokenExpired(TokenRefused):
    """A client access token past its expiry."""


@dataclass(frozen=True)
class ClientAccessToken:
    """A verified client access token: its client, its user and session (None for client_credentials), its
    scope, and its own identity and times."""

    client: OAuthClient
    user_id: str | None
    session_id: str | None
    scope: tuple[str, ...]
    jti: str
    issued_at: int
    expires_at: int
    audience: str

    def has_scope(self, name: str) -> bool:
        """Whether the token was granted scope `name`."""
        return name in self.scope


def issue(client: OAuthClient, scope: str, user_id: str | None = None, session_id: str | None = None) -> str:
    """A signed access token for `client`: a user's (in that session), or the client's own (no user)."""
    now = int(time.time())
    claims = {
        "iss": issuer(),
        "sub": user_id or client.client_id,
        "aud": client.audience or client.client_id,
        "client_id": client.client_id,
        "scope": scope,
        "jti": secrets.token_urlsafe(16),
        "iat": now,
        "exp": now + LIFETIME_SECONDS,
    }
    if session_id is not None:
        claims["sid"] = session_id
    return keys.sign(claims, typ=TYPE)


def verify(token: str) -> ClientAccessToken:
    """The token, when it is an active client access token but for its session (see `verify_user_token`);
    TokenExpired, or TokenRefused for anything else."""
    try:
        claims = keys.verify(token, typ=TYPE, verify_exp=False)
    except keys.TokenInvalid as error:
        raise TokenRefused(str(error)) from None
    user_id, session_id, scope = _checked_claims(claims)
    if claims["exp"] <= time.time():
        raise TokenExpired("expired")
    client = get_client(claims["client_id"])
    if client is None:
        raise TokenRefused("its client was deleted")
    if claims["aud"] != (client.audience or client.client_id):
        raise TokenRefused("not for its client's audience")
    if get_redis().exists(Keys.revoked_access_token(claims["jti"])):
        raise TokenRefused("revoked")
    return ClientAccessToken(
        client, user_id, session_id, scope, claims["jti"], claims["iat"], claims["exp"], claims["aud"]
    )


def _checked_claims(claims: dict) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(user id, session id, scope) the claims name (no user for a client's own token); TokenRefused for a
    missing or mistyped claim."""
    if any(not isinstance(claims.get(name), str) for name in ("sub", "client_id", "jti", "scope", "aud")):
        raise TokenRefused("a claim is missing")
    if any(not isinstance(claims.get(name), int) or isinstance(claims[name], bool) for name in ("iat", "exp")):
        raise TokenRefused("iat and exp must be integers")
    if claims["exp"] - claims["iat"] > LIFETIME_SECONDS:
        raise TokenRefused("lives longer than an access token may")
    session_id = claims.get("sid")
    if session_id is not None and not isinstance(session_id, str):
        raise TokenRefused("sid must be a string")
    user_id = claims["sub"] if session_id is not None else None
    return user_id, session_id, tuple(scope_to_list(claims["scope"]) or ())


def verify_user_token(token: str) -> tuple[ClientAccessToken, dict, int]:
    """A user's active client access token with its user's public fields and current token version; TokenRefused
    when it has no user (client_credentials) or its session has ended."""
    found = verify(token)
    if found.user_id is None or found.session_id is None:
        raise TokenRefused("no user")
    checked = sessions.verify_client_session(found.user_id, found.session_id)
    if checked is None:
        raise TokenRefused("its session has ended")
    return found, *checked


def revoke(found: ClientAccessToken) -> None:
    """Refuse the token from now on, everywhere, until it would have expired."""
    remaining = found.expires_at - int(time.time())
    if remaining > 0:
        get_redis().set(Keys.revoked_access_token(found.jti), "1", ex=remaining + 1)


def events_caller(token: str) -> Caller:
    """The caller a client access token with scope `events` stands for at the events endpoints: its user, in its
    session, never with an administrator's powers; 401 for anything else (no user, no scope, session ended)."""
    try:
        found, user, version = verify_user_token(token)
    except TokenExpired:
        raise unauthorized("The access token has expired.", "token_expired") from None
    except TokenRefused:
        raise unauthorized("The access token is not valid.") from None
    if not found.has_scope(EVENTS_SCOPE):
        raise unauthorized("This client's access token lacks the scope events.")
    return Caller(
        found.user_id, user["role"], found.session_id, version, found.expires_at, "bearer", user, found.client.client_id
    )


def introspection(token: str) -> dict | None:
    """RFC 7662's answer for an active client access token, or None when it is not one (or not active)."""
    try:
        found = verify(token)
    except TokenRefused:
        return None
    answer = {
        "active": True,
        "sub": found.user_id or found.client.client_id,
        "client_id": found.client.client_id,
        "scope": " ".join(found.scope),
        "exp": found.expires_at,
        "iat": found.issued_at,
        "iss": issuer(),
        "aud": found.audience,
        "token_type": "access_token",
    }
    if found.session_id is not None:
        checked = sessions.verify_client_session(found.user_id, found.session_id)
        if checked is None:
            return None
        answer.update(role=checked[0]["role"], sid=found.session_id)
    return answer


class ClientTokens:
    """What other packages ask of client access tokens, bound to the app (`app.extensions["client_tokens"]`), so
    that the guards and introspection need not import the provider."""

    events_caller = staticmethod(events_caller)
    introspection = staticmethod(introspection)


def init_app(app) -> None:
    """Let the guards and introspection consult client access tokens."""
    app.extensions["client_tokens"] = ClientTokens()
