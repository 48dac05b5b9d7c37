"""`/admin/users`: administrators find users, change roles, end sessions and delete accounts."""

from __future__ import annotations

from flask import Blueprint, jsonify, make_response

from ..auth import mfa, sessions, users
from ..auth.guards import current_caller, login_required
from ..errors import bad_request, forbidden, not_found
from ..http import validated, validated_query
from ..openapi import operation
from .schemas import SEARCH_LIMIT, AdminUserAnswer, AdminUsers, RoleChange, UserPath, UserQuery

bp = Blueprint("admin_users", __name__, url_prefix="/admin/users")
ADMIN = ("bearer", "cookie")


@bp.before_request
@login_required
def admins_only():
    """Every endpoint here is for administrators (the stored role, so a demotion applies at once)."""
    if not current_caller().is_admin:
        raise forbidden("Only administrators may manage users.")


def _no_store(body, status: int = 200):
    response = make_response(body, status)
    if status == 204:
        del response.headers["Content-Type"]
    response.headers["Cache-Control"] = "no-store"
    return response


def _target(user_id: str) -> dict:
    """The user a path names (404 for an unknown id or one of the wrong shape)."""
    user = users.get_user(user_id) if users.USER_ID.fullmatch(user_id) else None
    if user is None:
        raise not_found("No such user.")
    return user


def _not_yourself(user_id: str, action: str) -> None:
    """An administrator cannot lock themselves out by accident; another admin or the CLI can."""
    if user_id == current_caller().user_id:
        raise forbidden(f"You cannot {action} your own account here; ask another administrator or use the CLI.")


@bp.get("")
@operation(
    "Find users: by ?email=, by the start of their address (?q=), or a page newest first",
    tags=["admin"],
    query=UserQuery,
    responses={200: AdminUsers},
    errors=(400, 401, 403),
    auth=ADMIN,
)
def list_users():
    """Users newest first (`limit`, `offset`), the one with `?email=`, or the first whose address starts with `?q=`."""
    query = validated_query(UserQuery)
    refused = query.combination_refused()
    if refused:
        raise bad_request(refused)
    if query.q is not None:
        found = users.find_users_by_email_prefix(query.q, limit=SEARCH_LIMIT)
    else:
        found = users.list_users(email=query.email, limit=query.limit, offset=query.offset)
    return _no_store(jsonify({"users": [users.admin_view(user) for user in found]}))


@bp.patch("/<user_id>")
@operation(
    "Change a user's role (it applies on their next request)",
    tags=["admin"],
    path=UserPath,
    body=RoleChange,
    responses={200: AdminUserAnswer},
    errors=(400, 401, 403, 404, 409, 422),
    auth=ADMIN,
)
def change_role(user_id: str):
    """Change a user's role: it applies on that user's next request."""
    _target(user_id)
    role = validated(RoleChange).role
    _not_yourself(user_id, "change the role of")
    user = users.set_role(user_id, role)
    if user is None:
        raise not_found("No such user.")
    return _no_store(jsonify({"user": users.admin_view(user)}))


@bp.delete("/<user_id>/sessions")
@operation(
    "Log a user out on every device (live connections close)",
    tags=["admin"],
    path=UserPath,
    responses={204: None},
    errors=(401, 403, 404),
    auth=ADMIN,
)
def revoke_sessions(user_id: str):
    """Log the user out on every device: tokenVersion + 1, every session ended, live connections closed."""
    _target(user_id)
    sessions.logout_all(user_id)
    return _no_store("", 204)


@bp.post("/<user_id>/mfa/reset")
@operation(
    "Turn a user's MFA off: TOTP secret and recovery codes gone, every session ended, the owner mailed",
    tags=["admin"],
    path=UserPath,
    responses={204: None},
    errors=(401, 403, 404),
    auth=ADMIN,
)
def reset_mfa(user_id: str):
    """Reset the user's second factor (also when it is off): for an owner who lost it, or whose was hijacked."""
    _target(user_id)
    if mfa.reset(user_id) is None:
        raise not_found("No such user.")
    return _no_store("", 204)


@bp.delete("/<user_id>")
@operation(
    "Delete a user and every record of theirs; their sessions end at once",
    tags=["admin"],
    path=UserPath,
    responses={204: None},
    errors=(401, 403, 404, 409),
    auth=ADMIN,
)
def delete_user(user_id: str):
    """Delete the account and every record of it; its sessions and live connections end at once."""
    _target(user_id)
    _not_yourself(user_id, "delete")
    if not users.delete_user(user_id):
        raise not_found("No such user.")
    return _no_store("", 204)
