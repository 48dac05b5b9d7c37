"""`POST /auth/org`: a session switches its active organization, whose id and role its access tokens carry."""

from __future__ import annotations

from typing import Annotated

from flask import Blueprint
from pydantic import Field

from ..auth import sessions, users
from ..auth.answers import token_response
from ..auth.guards import current_caller, login_required
from ..auth.schemas import Tokens
from ..errors import forbidden, unauthorized
from ..http import validated
from ..openapi import operation
from ..redis import Keys, get_redis
from ..schemas import Body
from .store import ORG_ID

bp = Blueprint("org_switch", __name__)

TOKEN_COOKIES = {"Set-Cookie": "For a cookie-authenticated caller: __Host-access and __Secure-refresh, renewed."}


class OrgSwitch(Body):
    """The organization to act in from now on, or null for none."""

    org_id: Annotated[str, Field(max_length=200)] | None = Field(
        description="An organization the caller is a member of (else 403), or null to clear."
    )


@bp.post("/auth/org")
@operation(
    "Switch this session's active organization: new tokens carry org_id and org_role",
    tags=["organizations"],
    body=OrgSwitch,
    responses={200: Tokens},
    errors=(401, 403),
    headers={200: TOKEN_COOKIES},
    auth=("bearer", "cookie"),
)
@login_required
def switch_org():
    """Make an organization the caller's session's active one (or none), and answer `T` as a refresh does: in the
    transport the caller used (cookies for a cookie-authenticated caller, the body for a bearer), with the session's
    refresh token rotated."""
    org_id = validated(OrgSwitch).org_id
    caller = current_caller()
    if org_id is not None and not is_member(org_id, caller.user_id):
        raise forbidden("You are not a member of this organization.")
    issued = sessions.switch_org(caller.user_id, caller.session_id, org_id)
    user = users.get_user(caller.user_id)
    if issued is None or user is None:
        raise unauthorized("The session has ended; log in again.")
    transport = "cookie" if caller.via == "cookie" else "body"
    return token_response(
        user, caller.session_id, user["role"], int(user["token_version"]), issued.refresh_token, transport
    )


def is_member(org_id: str, user_id: str) -> bool:
    """Whether the user is a member of the organization (an id of another shape names none: not looked up)."""
    if not ORG_ID.fullmatch(org_id):
        return False
    return sessions.member_role(get_redis().hget(Keys.org_members(org_id), user_id)) is not None
