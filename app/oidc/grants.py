"""The provider's grants, as Authlib's classes with our storage and session rules.

- Authorization code (`AuthorizationCodeGrant`) with PKCE required for every client, S256 only
  (`S256CodeChallenge`), and OpenID Connect's ID token (`OpenIDCode`). A code is redeemed once (codes.py) and
  starts a client session (sessions.py); the ID token is signed by `keys.sign` (claims.py says why).
- Refresh token (`RefreshTokenGrant`): the client session's refresh token rotates exactly as every session's does
  (app/auth/sessions.py, with reuse detection); another client's refresh token is refused.
- Client credentials (`ClientCredentialsGrant`): a confidential client's own token, no user, no refresh token.

Tokens are made by `ClientTokens` (Authlib's bearer token generator): JWT access tokens (access_tokens.py) and,
with scope offline_access, the session's refresh token. Requested scopes must be among the client's registered
ones (invalid_scope otherwise). The grants that authenticate a client are rate limited per refresh token and per
client (app/oauth_server/throttle.py), never per address: a backend redeems codes and refreshes for all its users.
"""

from __future__ import annotations

from authlib.oauth2.rfc6749 import InvalidRequestError, InvalidScopeError, grants
from authlib.oauth2.rfc6749.util import scope_to_list
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import OpenIDCode as AuthlibOpenIDCode

from ..auth.sessions import hash_token
from ..oauth_server import throttle
from . import access_tokens, claims, codes, sessions
from .clients import SCOPES

CLIENT_AUTH = ["client_secret_basic", "client_secret_post", "none"]
SECRET_AUTH = ["client_secret_basic", "client_secret_post"]
OFFLINE_ACCESS = "offline_access"
USER_SCOPES = ("openid", "email", "profile", "offline_access", "orgs")  # about a user: no client's own token has one


class ClientScopes:
    """Requested scopes must be known and registered for the client (invalid_scope otherwise)."""

    def validate_requested_scope(self):
        """invalid_scope for a scope the provider does not know or the client is not registered for."""
        super().validate_requested_scope()
        asked = scope_to_list(self.request.payload.scope) or []
        if any(scope not in self.request.client.scopes for scope in asked):
            raise InvalidScopeError(f"This client may ask for: {' '.join(self.request.client.scopes)}.")


class S256CodeChallenge(CodeChallenge):
    """PKCE for every client, public and confidential alike, with S256 only (never `plain`)."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant, redirect_uri):
        """invalid_request unless the request carries a code_challenge with code_challenge_method=S256."""
        data = grant.request.payload.data
        if not data.get("code_challenge") or data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("PKCE is required: a code_challenge with code_challenge_method=S256.")
        super().validate_code_challenge(grant, redirect_uri)


class OpenIDCode(AuthlibOpenIDCode):
    """OpenID Connect for the code grant: the nonce check and the ID token (signed as claims.py says)."""

    def exists_nonce(self, nonce, request):
        """Whether another code of this client carries the nonce (a replayed authorization request)."""
        return codes.nonce_seen(request.payload.client_id, nonce)

    def generate_user_info(self, user, scope):
        """What the scope lets the client know about the user."""
        return claims.user_claims(user.user, scope)

    def encode_id_token(self, token, request):
        """The ID token: issuer, the user, the client, the sign-in's time and methods, the client session, the
        nonce asked for, and at_hash of the access token beside it."""
        user = request.user
        return claims.id_token(
            request.client.client_id,
            user.user,
            token["scope"],
            token["access_token"],
            user.session_id,
            user.auth_time,
            list(user.amr),
            user.nonce,
        )


class AuthorizationCodeGrant(ClientScopes, grants.AuthorizationCodeGrant):
    """The authorization code flow: codes kept in Redis, redeemed once, each starting a client session."""

    TOKEN_ENDPOINT_AUTH_METHODS = CLIENT_AUTH

    def save_authorization_code(self, code, request):
        """Keep the code with what it is bound to; a nonce serves one code."""
        nonce = request.payload.data.get("nonce") or None
        if nonce is not None and not codes.claim_nonce(request.client.client_id, nonce):
            raise InvalidRequestError("This nonce was used already.")
        data = request.payload.data
        codes.save(
            code,
            request.client.client_id,
            request.payload.redirect_uri,
            request.scope,
            data["code_challenge"],
            nonce,
            request.user,
        )

    def query_authorization_code(self, code, client):
        """The code, if it is alive and this client's (a second use ends what the first gave, and finds none)."""
        return codes.find(code, client.client_id)

    def delete_authorization_code(self, authorization_code):
        """Kept: a used code is remembered a while, so that a second use is recognised (codes.py)."""

    def authenticate_user(self, authorization_code):
        """Redeem the code: its client session starts (invalid_grant if the code was used already)."""
        return sessions.start(authorization_code, self.request.client)


class RefreshTokenGrant(grants.RefreshTokenGrant):
    """Refreshing a client session: its refresh token rotates, with reuse detection, as every session's does."""

    TOKEN_ENDPOINT_AUTH_METHODS = CLIENT_AUTH
    INCLUDE_NEW_REFRESH_TOKEN = True

    def authenticate_refresh_token(self, refresh_token):
        """The client session the token names (its reuse is judged by the rotation, after the client check)."""
        throttle.take("refresh", "token:" + hash_token(refresh_token)[:32])
        return sessions.refresh_credential(refresh_token)

    def authenticate_user(self, refresh_token):
        """Rotate the refresh token (a reused one ends its session: invalid_grant)."""
        return sessions.rotate(refresh_token)

    def revoke_old_credential(self, refresh_token):
        """Done by the rotation itself, in the same step."""


class ClientCredentialsGrant(ClientScopes, grants.ClientCredentialsGrant):
    """A confidential client's own access token: `sub` is its client_id; no user, no refresh token."""

    TOKEN_ENDPOINT_AUTH_METHODS = SECRET_AUTH

    def validate_token_request(self):
        """The client authenticates (its secret) and may ask this many tokens a minute (RATE_LIMIT_LOGIN: a backend
        needs one per 15 minutes)."""
        super().validate_token_request()
        throttle.take("login", "client:" + self.request.client.client_id)

    def validate_requested_scope(self):
        """The client's scopes, none of them about a user."""
        super().validate_requested_scope()
        asked = scope_to_list(self.request.payload.scope) or []
        if any(scope in USER_SCOPES for scope in asked):
            raise InvalidScopeError("A client's own token has no user: openid, email, profile, offline_access, orgs.")


class ClientTokens(BearerTokenGenerator):
    """Tokens for a client: a JWT access token (900 s) and, with offline_access, the session's refresh token."""

    def __init__(self):
        super().__init__(self._access_token, self._refresh_token, access_tokens.LIFETIME_SECONDS)

    @staticmethod
    def _access_token(client, grant_type, user, scope):
        if user is None:
            return access_tokens.issue(client, scope)
        return access_tokens.issue(client, scope, user.user_id, user.session_id)

    @staticmethod
    def _refresh_token(client, grant_type, user, scope):
        return user.refresh_token if user is not None and OFFLINE_ACCESS in (scope_to_list(scope) or ()) else None

    def generate(self, grant_type, client, user=None, scope=None, expires_in=None, include_refresh_token=True):
        """The token answer, without a refresh_token field when none is given."""
        token = super().generate(grant_type, client, user, scope, expires_in, include_refresh_token)
        if token.get("refresh_token") is None:
            token.pop("refresh_token", None)
        return token


def register(server) -> None:
    """Register the grants and the token generator on the service's authorization server."""
    server.scopes_supported = list(SCOPES)
    generator = ClientTokens()
    for grant_type in ("authorization_code", "refresh_token", "client_credentials"):
        server.register_token_generator(grant_type, generator)
    server.register_grant(AuthorizationCodeGrant, [S256CodeChallenge(required=True), OpenIDCode(require_nonce=False)])
    server.register_grant(RefreshTokenGrant)
    server.register_grant(ClientCredentialsGrant)
