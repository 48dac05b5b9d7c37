"""What `/admin/issuers` takes and answers (`X` in docs/api.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..outgoing.ssrf import URL_LIMIT
from ..schemas import Answer, Body, JsonValue, PlainText
from .store import ALGORITHMS, NAME_PATTERN, SECRET_MIN_BYTES

ClaimName = Annotated[PlainText, Field(min_length=1, max_length=200, description="The name of a claim of the token.")]
Jwk = Annotated[dict[str, JsonValue], Field(description="A public JSON Web Key (RFC 7517).")]


class IssuerPath(Body):
    """An issuer's name (in PUT, another shape is 422; elsewhere 404)."""

    name: Annotated[str, Field(pattern=rf"^{NAME_PATTERN}$")]


class KeySet(Body):
    """A JSON Web Key Set of public keys."""

    keys: list[Jwk] = Field(min_length=1, max_length=100)


class IssuerRequest(Body):
    """An issuer: whose tokens are accepted (`issuer`, `audience`), signed how, and which claims say what.
    Exactly one of `jwks_url`, `jwks` and `secret`."""

    issuer: Annotated[PlainText, Field(min_length=1, max_length=URL_LIMIT, description="Tokens' `iss`.")]
    audience: Annotated[PlainText, Field(min_length=1, max_length=URL_LIMIT, description="Is or is in tokens' `aud`.")]
    algorithms: list[Literal[ALGORITHMS]] = Field(
        min_length=1,
        max_length=len(ALGORITHMS),
        description="JWS algorithms; HS256/HS384/HS512 only with `secret` (and then only they); never none.",
    )
    jwks_url: str | None = Field(
        None,
        max_length=URL_LIMIT,
        description="Where the issuer publishes its keys: an https URL of a public address (unless "
        "WEBHOOK_OUT_ALLOW_HTTP / WEBHOOK_OUT_ALLOW_PRIVATE allow others), checked now and at every fetch.",
    )
    jwks: KeySet | None = Field(None, description="The issuer's public keys, given here.")
    secret: Annotated[PlainText, Field(max_length=1024)] | None = Field(
        None,
        description=f"An HMAC secret: at least {SECRET_MIN_BYTES} bytes (48 with HS384, 64 with HS512). Never shown.",
    )
    email_claim: ClaimName | None = Field(None, description="Where tokens give the e-mail (default `email`).")
    channels_claim: ClaimName | None = Field(None, description="A claim listing channels each exchange grants.")
    info_claim: ClaimName | None = Field(None, description="A claim whose object (<= 1 KiB) is the grants' info.")


class IssuerAnswer(Answer):
    """`X`: an issuer as answers show it (never its secret)."""

    name: str
    issuer: str
    audience: str
    algorithms: list[str]
    jwks_url: str | None
    jwks: dict[str, JsonValue] | None
    email_claim: str
    channels_claim: str | None
    info_claim: str | None
    created_at: str


class Issuers(Answer):
    """Every issuer, by name."""

    issuers: list[IssuerAnswer]
