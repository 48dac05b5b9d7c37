"""What `/admin/oauth-clients` takes and answers (`C` in docs/api.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..outgoing.ssrf import URL_LIMIT
from ..schemas import Answer, Body, PlainText
from .clients import CLIENT_ID_PATTERN, GRANT_TYPES, NAME_LIMIT, SCOPES, TYPES, URIS_LIMIT

RedirectUri = Annotated[str, Field(min_length=1, max_length=URL_LIMIT)]
RedirectUris = Annotated[
    list[RedirectUri],
    Field(
        max_length=URIS_LIMIT,
        description="Exact strings: https://, http:// on a loopback host (127.0.0.1, [::1], localhost), or for "
        "public clients a private-use scheme such as com.example.app:/cb; never a fragment.",
    ),
]
Name = Annotated[PlainText, Field(min_length=1, max_length=NAME_LIMIT, description="Shown to users at consent.")]
Audience = Annotated[
    PlainText, Field(min_length=1, max_length=URL_LIMIT, description="The `aud` of its access tokens.")
]
BackchannelUri = Annotated[
    str,
    Field(
        max_length=URL_LIMIT,
        description="Where logout tokens are POSTed: an https URL of a public address (unless "
        "WEBHOOK_OUT_ALLOW_HTTP / WEBHOOK_OUT_ALLOW_PRIVATE allow others), checked when saved and at every send.",
    ),
]
GrantTypes = Annotated[list[Literal[GRANT_TYPES]], Field(min_length=1, max_length=10)]
Scopes = Annotated[list[Literal[SCOPES]], Field(min_length=1, max_length=20)]


class ClientPath(Body):
    """A client's id (another shape is 404)."""

    client_id: Annotated[str, Field(pattern=rf"^{CLIENT_ID_PATTERN}$")]


class ClientRequest(Body):
    """A new client: who it is, where it may send users back, and what it may ask for."""

    name: Name
    type: Literal[TYPES] = Field(description="confidential: a server that keeps a secret; public: a mobile or SPA app.")
    redirect_uris: RedirectUris = Field(description="At least one when the client uses authorization_code.")
    grant_types: GrantTypes | None = Field(
        None, description="Default authorization_code and refresh_token; client_credentials for confidential only."
    )
    scopes: Scopes | None = Field(None, description="What it may ask for; default openid.")
    post_logout_redirect_uris: RedirectUris | None = Field(None, description="Where logout may send users back.")
    backchannel_logout_uri: BackchannelUri | None = None
    first_party: bool = Field(False, description="The product's own application: no consent page.")
    audience: Audience | None = Field(None, description="Default: the client_id.")


class ClientChanges(Body):
    """Some of a client's settings; what is absent stays. `backchannel_logout_uri: null` removes it and
    `audience: null` makes it the client_id again. The type cannot change."""

    name: Name | None = None
    type: Literal[TYPES] | None = None
    redirect_uris: RedirectUris | None = None
    grant_types: GrantTypes | None = None
    scopes: Scopes | None = None
    post_logout_redirect_uris: RedirectUris | None = None
    backchannel_logout_uri: BackchannelUri | None = None
    first_party: bool | None = None
    audience: Audience | None = None


class ClientAnswer(Answer):
    """`C`: a client as answers show it (never its secret)."""

    client_id: str = Field(pattern=rf"^{CLIENT_ID_PATTERN}$")
    name: str
    type: Literal[TYPES]
    redirect_uris: list[str]
    grant_types: list[Literal[GRANT_TYPES]]
    scopes: list[Literal[SCOPES]]
    post_logout_redirect_uris: list[str]
    backchannel_logout_uri: str | None
    first_party: bool
    audience: str
    created_at: str


class CreatedClient(ClientAnswer):
    """`C` with its secret (confidential clients), shown this once."""

    client_secret: str | None = Field(None, pattern=r"^cs_[A-Za-z0-9_-]{43}$")


class Clients(Answer):
    """Every client, oldest first."""

    clients: list[ClientAnswer]


class NewClientSecret(Answer):
    """The client's new secret, shown this once; the previous one no longer works."""

    client_secret: str = Field(pattern=r"^cs_[A-Za-z0-9_-]{43}$")
