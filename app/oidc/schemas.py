"""What the provider's authorization, userinfo, revocation and consent endpoints take and answer."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..schemas import Answer, Body
from .clients import CLIENT_ID_PATTERN, SCOPES

ClientId = Annotated[str, Field(pattern=rf"^{CLIENT_ID_PATTERN}$")]


class AuthorizationRequest(Body):
    """An OpenID Connect authentication request (the authorization code flow, PKCE with S256)."""

    response_type: Literal["code"]
    client_id: ClientId
    redirect_uri: str | None = Field(None, description="One registered for the client, exactly (else a 400 page).")
    scope: str | None = Field(None, description=f"Space separated, among the client's: {', '.join(SCOPES)}.")
    state: str | None = Field(None, description="Given back with the code or the error.")
    code_challenge: Annotated[str, Field(pattern=r"^[A-Za-z0-9._~-]{43,128}$")]
    code_challenge_method: Literal["S256"]
    nonce: str | None = Field(None, description="Copied into the ID token.")
    prompt: str | None = Field(None, description="none, login or consent (none alone).")
    max_age: Annotated[str, Field(pattern=r"^[0-9]{1,10}$")] | None = Field(
        None, description="Seconds: an older sign-in is asked again (prompt=none: login_required)."
    )


class UserInfo(Answer):
    """The claims about the user that the token's scope allows."""

    sub: str = Field(description="The user's id.")
    email: str | None = Field(None, description="With scope email.")
    email_verified: bool | None = Field(None, description="With scope email.")
    preferred_username: str | None = Field(None, description="With scope profile: the e-mail's local part.")


class RevocationRequest(Body):
    """RFC 7009: a token of the client's to revoke (client authentication as at the token endpoint)."""

    token: Annotated[str, Field(min_length=1)]
    token_type_hint: Literal["access_token", "refresh_token"] | None = None
    client_id: str | None = Field(None, description="A public client's id, or client_secret_post's.")
    client_secret: str | None = Field(None, description="client_secret_post (or send it by HTTP Basic).")


class Revoked(Answer):
    """Revoked, or nothing to revoke (RFC 7009 answers the same)."""


class ConsentPath(Body):
    """A client's id (another shape is 404)."""

    client_id: ClientId


class Consent(Answer):
    """What the user let one client have."""

    client_id: str
    name: str = Field(description="The client's name.")
    scopes: list[str]
    granted_at: str = Field(description="When the user last allowed it something (RFC 3339).")


class Consents(Answer):
    """The user's consents, newest first."""

    consents: list[Consent]
