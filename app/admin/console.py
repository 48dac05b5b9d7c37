"""`GET /admin`: the admin console, a browser page for administrators on `client.js`; and `GET
/admin/users/{id}`, one user with their sessions and passkeys, which the console shows and no other
endpoint answers for someone else's account.

Everything the console changes goes through the HTTP API the admin views already serve; the page holds
no data of its own. It is served only to an administrator: a visitor without a valid access token is sent
to `/` (whose script refreshes the session and comes back for an admin, see app.js), a signed-in
non-administrator is refused with 403.
"""

from __future__ import annotations

from flask import Blueprint, jsonify, redirect, render_template

from ..apikeys.store import SCOPES
from ..audit import TYPES
from ..auth import passkeys, sessions, users
from ..auth.guards import authenticate, current_caller, login_required
from ..auth.schemas import Passkey, Session
from ..errors import ApiError, forbidden, not_found
from ..openapi import operation
from ..schemas import Answer
from .schemas import AdminUser, UserPath

bp = Blueprint("admin_console", __name__)
ADMIN = ("bearer", "cookie")
# Where a visitor without a session goes: the page, which sends an administrator back once signed in.
SIGN_IN_FIRST = "/?next=/admin"
NO_STORE = {"Cache-Control": "no-store"}


class AdminUserDetail(Answer):
    """One user as the console shows them: `U` with when it was made, their sessions and their passkeys."""

    user: AdminUser
    sessions: list[Session]
    passkeys: list[Passkey]


def _signed_in_caller():
    """The user calling with a valid access token, or None (no token, a bad or expired one, an API key)."""
    try:
        caller = authenticate()
    except ApiError as refused:
        if refused.status not in (401, 403):  # 403: an API key, which is no one who can sign in
            raise
        return None
    return caller


@bp.get("/admin")
@operation(
    "The admin console: a page for administrators (others are sent to / or refused)",
    tags=["pages"],
    responses={
        200: ("text/html", "The console"),
        303: None,
        403: ("text/html", "A page saying the console is for administrators"),
    },
    headers={303: {"Location": "/?next=/admin: the page, which sends an administrator back once signed in."}},
)
def console():
    """The console for an administrator; `/` for a visitor without a session; 403 for anyone else.

    The stored role decides (as on every admin endpoint), so a demoted administrator loses the page at
    once; the page's own requests are refused just the same by the API.
    """
    caller = _signed_in_caller()
    if caller is None:
        return redirect(SIGN_IN_FIRST, 303)
    if not caller.is_admin:
        return render_template("admin_refused.html", email=caller.user["email"]), 403, NO_STORE
    return render_template("admin.html", me=caller.user, scopes=SCOPES, audit_types=TYPES), 200, NO_STORE


@bp.get("/admin/users/<user_id>")
@operation(
    "One user with their sessions and passkeys (administrators)",
    tags=["admin"],
    path=UserPath,
    responses={200: AdminUserDetail},
    errors=(401, 403, 404),
    auth=ADMIN,
)
@login_required
def show_user(user_id: str):
    """A user by id (audit entries name users by id), with their live sessions and their passkeys."""
    if not current_caller().is_admin:
        raise forbidden("Only administrators may manage users.")
    user = users.get_user(user_id) if users.USER_ID.fullmatch(user_id) else None
    if user is None:
        raise not_found("No such user.")
    answer = jsonify(
        {
            "user": users.admin_view(user),
            "sessions": sessions.list_sessions(user_id, None),
            "passkeys": passkeys.list_passkeys(user_id),
        }
    )
    answer.headers.update(NO_STORE)
    return answer
