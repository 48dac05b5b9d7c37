"""What `POST /oauth/token` takes (a form, one shape per grant type) and answers, its errors in RFC 6749's shape."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, RootModel

from ..auth.schemas import ExternalIdentity, Tokens, User
from ..schemas import Answer, Body, PlainText
from .grants import ACCESS_TOKEN_TYPE, DEVICE_MAX, SUBJECT_TOKEN_TYPES, TOKEN_EXCHANGE, TRANSPORTS


class ExchangeRequest(Body):
    """RFC 8693 token exchange: a trusted issuer's token (a JWT) for a session of this service."""

    grant_type: Literal[TOKEN_EXCHANGE]
    subject_token: Annotated[str, Field(min_length=1, description="A JWT of a trusted issuer (/admin/issuers).")]
    subject_token_type: Literal[SUBJECT_TOKEN_TYPES]
    requested_token_type: Literal[ACCESS_TOKEN_TYPE] | None = None
    transport: Literal[TRANSPORTS] = Field(
        "body", description="body: tokens in the answer; cookie: HttpOnly cookies (the cross-site rule applies)."
    )
    device: Annotated[PlainText, Field(max_length=DEVICE_MAX)] | None = Field(
        None, description="A name for this device (defaults to the User-Agent)."
    )


ClientSecret = Field(
    None, description="client_secret_post: a confidential client's secret (or send it by HTTP Basic instead)."
)


class AuthorizationCodeRequest(Body):
    """OpenID provider: redeem an authorization code (once), with the PKCE verifier of its challenge."""

    grant_type: Literal["authorization_code"]
    code: Annotated[str, Field(min_length=1)]
    redirect_uri: str | None = Field(None, description="Exactly as in the authorization request, if it named one.")
    code_verifier: Annotated[str, Field(pattern=r"^[A-Za-z0-9._~-]{43,128}$")]
    client_id: str | None = Field(None, description="A public client's id (client authentication none).")
    client_secret: str | None = ClientSecret


class RefreshRequest(Body):
    """OpenID provider: rotate a client session's refresh token (scope offline_access)."""

    grant_type: Literal["refresh_token"]
    refresh_token: Annotated[str, Field(min_length=1)]
    scope: str | None = Field(None, description="At most the scope granted; the whole of it by default.")
    client_id: str | None = None
    client_secret: str | None = ClientSecret


class ClientCredentialsRequest(Body):
    """OpenID provider: a confidential client's own access token (no user)."""

    grant_type: Literal["client_credentials"]
    scope: str | None = Field(None, description="Among the client's scopes: events, orgs.")
    client_id: str | None = None
    client_secret: str | None = ClientSecret


class TokenRequest(RootModel):
    """The token request of one grant type (`grant_type` tells which)."""

    model_config = ConfigDict(defer_build=True)  # built on first use, as Body and Answer are

    root: Annotated[
        ExchangeRequest | AuthorizationCodeRequest | RefreshRequest | ClientCredentialsRequest,
        Field(discriminator="grant_type"),
    ]


class ClientTokens(Answer):
    """A client's tokens: a JWT access token (typ at+jwt, 900 s), with scope openid an ID token, with scope
    offline_access a refresh token."""

    access_token: str
    token_type: Literal["Bearer"]
    expires_in: int
    scope: str | None = None
    refresh_token: str | None = None
    id_token: str | None = None


class ExternalUser(User):
    """`U` of a user from a trusted issuer: its e-mail as the issuer gave it (or null), and its identity there."""

    external: ExternalIdentity


class ExchangedTokens(Tokens):
    """`T` with the type of token issued (RFC 8693)."""

    issued_token_type: Literal[ACCESS_TOKEN_TYPE]
    user: ExternalUser


class TokenAnswer(RootModel):
    """The tokens of a client (OpenID provider grants), or `T` of a token exchange."""

    model_config = ConfigDict(defer_build=True)  # built on first use, as Body and Answer are

    root: ClientTokens | ExchangedTokens


class TokenError(Answer):
    """An error of the token endpoint, in RFC 6749's shape: `invalid_request`, `invalid_grant`, `invalid_client`
    (401), `invalid_scope`, `unauthorized_client`, `unsupported_grant_type`, `unsupported_token_type`,
    `invalid_token` and `insufficient_scope` (userinfo), `insecure_transport` (plain HTTP from anywhere but
    loopback); and as the
    service's other errors name them: `csrf_rejected` (403), `payload_too_large` (413), `rate_limited`
    (429), `unavailable` (503)."""

    error: str = Field(pattern=r"^[a-z][a-z0-9_]*$", examples=["invalid_grant"])
    error_description: str | None = None
