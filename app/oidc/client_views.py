"""`/admin/oauth-clients`: the applications that log users in with this service (admins and `clients:manage` keys)."""

from __future__ import annotations

import functools

from flask import Blueprint, jsonify

from ..auth.guards import current_api_key, current_caller, user_or_api_key
from ..errors import bad_request, forbidden, not_found
from ..http import validated
from ..openapi import operation
from . import clients
from .client_schemas import (
    ClientAnswer,
    ClientChanges,
    ClientPath,
    ClientRequest,
    Clients,
    CreatedClient,
    NewClientSecret,
)

bp = Blueprint("oauth_clients", __name__, url_prefix="/admin/oauth-clients")

SCOPE = "clients:manage"
MANAGERS = ("bearer", "cookie", "api_key")
NO_STORE = {"Cache-Control": "no-store"}
# PATCH fields that null clears (back to the default); any other is refused as null.
NULLABLE = ("backchannel_logout_uri", "audience")


def managers_only(view):
    """Decorate a view for administrators and API keys with scope clients:manage (403 for others)."""

    @functools.wraps(view)
    @user_or_api_key(SCOPE)
    def wrapper(*args, **kwargs):
        if current_api_key() is None and not current_caller().is_admin:
            raise forbidden(f"Only administrators (or API keys with scope {SCOPE}) may manage OAuth clients.")
        return view(*args, **kwargs)

    return wrapper


def _client(client_id: str) -> clients.OAuthClient:
    client = clients.get_client(client_id)
    if client is None:
        raise not_found("No such OAuth client.")
    return client


@bp.post("")
@operation(
    "Register an OAuth client (a confidential client's secret shown this once)",
    tags=["openid provider"],
    body=ClientRequest,
    responses={201: CreatedClient},
    auth=MANAGERS,
)
@managers_only
def create_client():
    """A new client; its id is made here, and a confidential client's secret is answered this once."""
    asked = validated(ClientRequest)
    client, secret = clients.create_client(
        clients.OAuthClient(
            client_id="",
            name=asked.name,
            type=asked.type,
            redirect_uris=tuple(asked.redirect_uris),
            grant_types=tuple(asked.grant_types or clients.DEFAULT_GRANT_TYPES),
            scopes=tuple(asked.scopes or clients.DEFAULT_SCOPES),
            post_logout_redirect_uris=tuple(asked.post_logout_redirect_uris or ()),
            backchannel_logout_uri=asked.backchannel_logout_uri,
            first_party=asked.first_party,
            audience=asked.audience or "",
        )
    )
    answer = client.answer() if secret is None else {**client.answer(), "client_secret": secret}
    return jsonify(answer), 201, NO_STORE


@bp.get("")
@operation("Every OAuth client (never a secret)", tags=["openid provider"], responses={200: Clients}, auth=MANAGERS)
@managers_only
def list_clients():
    """Every client, oldest first."""
    return jsonify({"clients": [client.answer() for client in clients.list_clients()]})


@bp.get("/<client_id>")
@operation(
    "One OAuth client (never its secret)",
    tags=["openid provider"],
    path=ClientPath,
    responses={200: ClientAnswer},
    auth=MANAGERS,
)
@managers_only
def show_client(client_id: str):
    """One client by id."""
    return jsonify(_client(client_id).answer())


@bp.patch("/<client_id>")
@operation(
    "Change an OAuth client's settings (checked as at registration)",
    tags=["openid provider"],
    path=ClientPath,
    body=ClientChanges,
    responses={200: ClientAnswer},
    errors=(409,),
    auth=MANAGERS,
)
@managers_only
def update_client(client_id: str):
    """Change any of a client's settings but its type; what is absent stays."""
    _client(client_id)
    asked = validated(ClientChanges)
    changes = {}
    for name in asked.model_fields_set:
        value = getattr(asked, name)
        if value is None and name not in NULLABLE:
            raise bad_request(f"Field '{name}' must not be null.")
        changes[name] = tuple(value) if isinstance(value, list) else value
    updated = clients.update_client(client_id, changes)
    if updated is None:
        raise not_found("No such OAuth client.")
    return jsonify(updated.answer())


@bp.delete("/<client_id>")
@operation(
    "Delete an OAuth client: every token and session issued to it ends",
    tags=["openid provider"],
    path=ClientPath,
    responses={204: None},
    auth=MANAGERS,
)
@managers_only
def delete_client(client_id: str):
    """Delete a client: its id is unknown from now on, and what was issued to it stops working."""
    if not clients.delete_client(client_id):
        raise not_found("No such OAuth client.")
    return "", 204


@bp.post("/<client_id>/rotate-secret")
@operation(
    "Give a confidential OAuth client a new secret (the old one stops working at once)",
    tags=["openid provider"],
    path=ClientPath,
    responses={200: NewClientSecret},
    errors=(409,),
    auth=MANAGERS,
)
@managers_only
def rotate_secret(client_id: str):
    """A new secret, shown this once; 409 for a public client, which has none."""
    _client(client_id)
    secret = clients.rotate_secret(client_id)
    if secret is None:
        raise not_found("No such OAuth client.")
    return jsonify({"client_secret": secret}), 200, NO_STORE
