"""The provider's other endpoints, as Authlib's: revocation (RFC 7009) and userinfo (OpenID Connect Core 5.3).

Revocation authenticates the client as the token endpoint does. A refresh token of the client's ends the client
session it belongs to (every token of it stops working); an access token of the client's is refused from then on
(its `jti` is kept in Redis until it would have expired). A token that is not the client's, or not one at all,
is answered 200 with nothing done (RFC 7009), except another client's token: 400 invalid_grant (Authlib's rule).

Userinfo takes a user's client access token with scope openid as a bearer token (RFC 6750) and answers the
claims its scope allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from authlib.integrations.flask_oauth2 import ResourceProtector
from authlib.oauth2.rfc6750 import BearerTokenValidator
from authlib.oauth2.rfc7009 import RevocationEndpoint as AuthlibRevocationEndpoint
from authlib.oidc.core import UserInfoEndpoint as AuthlibUserInfoEndpoint

from ..auth import sessions as auth_sessions
from . import access_tokens, claims, sessions
from .clients import OAuthClient
from .grants import CLIENT_AUTH
from .issuer import issuer


@dataclass(frozen=True)
class RefreshToken:
    """A live refresh token of a client session, as revocation finds it."""

    user_id: str
    session_id: str
    client_id: str

    def check_client(self, client: OAuthClient) -> bool:
        """Whether it was issued to this client."""
        return client.client_id == self.client_id


@dataclass(frozen=True)
class AccessToken:
    """A client access token (verified, maybe expired already), as revocation and userinfo find it."""

    found: access_tokens.ClientAccessToken
    user: dict | None = None  # U, for a user's token whose session lives

    def check_client(self, client: OAuthClient) -> bool:
        """Whether it was issued to this client."""
        return client.client_id == self.found.client.client_id

    @property
    def scope(self) -> str:
        """Its scope (space separated)."""
        return " ".join(self.found.scope)

    def get_scope(self) -> str:
        """Its scope."""
        return self.scope

    def get_client(self) -> OAuthClient:
        """Its client."""
        return self.found.client

    def get_user(self) -> dict | None:
        """Its user (U)."""
        return self.user

    def is_expired(self) -> bool:
        """Never: an expired token is not found at all."""
        return False

    def is_revoked(self) -> bool:
        """Never: a revoked token is not found at all."""
        return False


class RevocationEndpoint(AuthlibRevocationEndpoint):
    """POST /oauth/revoke: client authentication as at the token endpoint."""

    CLIENT_AUTH_METHODS = CLIENT_AUTH

    def query_token(self, token_string, token_type_hint):
        """A live refresh token of a client session, or an active client access token; None for anything else."""
        named = auth_sessions.session_of_refresh_token(token_string)
        if named is not None:
            credential = sessions.refresh_credential(token_string)
            return RefreshToken(*named, credential.client_id) if credential is not None else None
        try:
            return AccessToken(access_tokens.verify(token_string))
        except access_tokens.TokenRefused:
            return None

    def revoke_token(self, token, request):
        """A refresh token: its client session ends. An access token: refused from now on."""
        if isinstance(token, RefreshToken):
            auth_sessions.end_session(token.user_id, token.session_id, "session.revoked")
        else:
            access_tokens.revoke(token.found)


class ClientTokenValidator(BearerTokenValidator):
    """A user's client access token whose session lives (RFC 6750 bearer token)."""

    def authenticate_token(self, token_string):
        """The token and its user, or None (Authlib answers 401 invalid_token)."""
        try:
            found, user, _ = access_tokens.verify_user_token(token_string)
        except access_tokens.TokenRefused:
            return None
        return AccessToken(found, user)


class UserInfoEndpoint(AuthlibUserInfoEndpoint):
    """GET or POST /oauth/userinfo: the claims the token's scope allows, as JSON."""

    def get_issuer(self) -> str:
        """The provider's issuer."""
        return issuer()

    def generate_user_info(self, user, scope):
        """What the scope lets the client know about the user."""
        return claims.user_claims(user, scope)


def register(server) -> None:
    """Register revocation and userinfo on the service's authorization server."""
    protector = ResourceProtector()
    protector.register_token_validator(ClientTokenValidator())
    server.register_endpoint(RevocationEndpoint)
    server.register_endpoint(UserInfoEndpoint(resource_protector=protector))
