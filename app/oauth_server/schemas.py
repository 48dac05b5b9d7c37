"""What `POST /oauth/token` takes (a form) and answers, its errors in RFC 6749's shape."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..auth.schemas import ExternalIdentity, Tokens, User
from ..schemas import Answer, Body, PlainText
from .grants import ACCESS_TOKEN_TYPE, DEVICE_MAX, SUBJECT_TOKEN_TYPES, TOKEN_EXCHANGE, TRANSPORTS


class TokenRequest(Body):
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


class ExternalUser(User):
    """`U` of a user from a trusted issuer: its e-mail as the issuer gave it (or null), and its identity there."""

    external: ExternalIdentity


class ExchangedTokens(Tokens):
    """`T` with the type of token issued (RFC 8693)."""

    issued_token_type: Literal[ACCESS_TOKEN_TYPE]
    user: ExternalUser


class TokenError(Answer):
    """An error of the token endpoint, in RFC 6749's shape: `invalid_request`, `invalid_grant`,
    `unsupported_grant_type`, `insecure_transport` (plain HTTP from anywhere but loopback); and as the
    service's other errors name them: `csrf_rejected` (403), `payload_too_large` (413), `rate_limited`
    (429), `unavailable` (503)."""

    error: str = Field(pattern=r"^[a-z][a-z0-9_]*$", examples=["invalid_grant"])
    error_description: str | None = None
