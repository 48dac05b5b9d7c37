"""`/admin/api-keys`: admins create, list and delete the keys backends use (docs/api.md, API keys)."""

from __future__ import annotations

import re

from flask import Blueprint, jsonify

from ..auth.guards import current_caller, login_required
from ..errors import bad_request, forbidden, not_found
from ..http import field, json_body
from . import store

bp = Blueprint("apikeys", __name__, url_prefix="/admin/api-keys")
KEY_ID = re.compile(r"[0-9a-f]{32}")


@bp.before_request
@login_required
def admins_only():
    """Every endpoint here is for administrators (a user's access token with the admin role)."""
    if not current_caller().is_admin:
        raise forbidden("Only administrators may manage API keys.")


@bp.post("")
def create():
    """Create a key; the answer is the only time the key itself is shown."""
    body = json_body()
    raw, key = store.create_key(
        field(body, "name"), _strings(body, "scopes"), _strings(body, "channels", required=False)
    )
    return jsonify({**key, "key": raw}), 201


@bp.get("")
def list_keys():
    """Every key, without the key itself."""
    return jsonify({"api_keys": store.list_keys()})


@bp.delete("/<key_id>")
def delete(key_id: str):
    """Delete a key: it stops working with the next request, on every worker and instance."""
    if not KEY_ID.fullmatch(key_id) or not store.delete_key(key_id):
        raise not_found("No such API key.")
    return "", 204


def _strings(body: dict, name: str, required: bool = True) -> list[str]:
    values = field(body, name, list, required=required, default=[])
    if not all(isinstance(value, str) for value in values):
        raise bad_request(f"Field '{name}' must be a list of strings.")
    return values
