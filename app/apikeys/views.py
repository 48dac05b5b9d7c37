"""`/admin/api-keys`: admins create, list and delete the keys backends use (docs/api.md, API keys)."""

from __future__ import annotations

import re

from flask import Blueprint, jsonify

from ..auth.guards import current_caller, login_required
from ..errors import forbidden, not_found
from ..http import validated
from ..openapi import operation
from . import store
from .schemas import ApiKeys, CreatedKey, KeyPath, KeyRequest

bp = Blueprint("apikeys", __name__, url_prefix="/admin/api-keys")
KEY_ID = re.compile(r"[0-9a-f]{32}")
ADMIN = ("bearer", "cookie")


@bp.before_request
@login_required
def admins_only():
    """Every endpoint here is for administrators (a user's access token with the admin role)."""
    if not current_caller().is_admin:
        raise forbidden("Only administrators may manage API keys.")


@bp.post("")
@operation(
    "Create an API key (shown this once)",
    tags=["credentials"],
    body=KeyRequest,
    responses={201: CreatedKey},
    auth=ADMIN,
)
def create():
    """Create a key; the answer is the only time the key itself is shown."""
    asked = validated(KeyRequest)
    raw, key = store.create_key(asked.name, list(asked.scopes), list(asked.channels))
    return jsonify({**key, "key": raw}), 201


@bp.get("")
@operation("Every API key, without the keys themselves", tags=["credentials"], responses={200: ApiKeys}, auth=ADMIN)
def list_keys():
    """Every key, without the key itself."""
    return jsonify({"api_keys": store.list_keys()})


@bp.delete("/<key_id>")
@operation(
    "Delete an API key, at once everywhere", tags=["credentials"], path=KeyPath, responses={204: None}, auth=ADMIN
)
def delete(key_id: str):
    """Delete a key: it stops working with the next request, on every worker and instance."""
    if not KEY_ID.fullmatch(key_id) or not store.delete_key(key_id):
        raise not_found("No such API key.")
    return "", 204
