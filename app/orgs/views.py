"""`/orgs` (users, and API keys with scope orgs:manage acting as owners) and `/admin/orgs` (administrators)."""

from __future__ import annotations

import functools

from flask import Blueprint, jsonify

from ..auth.guards import current_api_key, current_caller, login_required, user_or_api_key
from ..errors import forbidden, not_found
from ..http import validated, validated_query
from ..openapi import operation
from . import manage, store
from .schemas import (
    InvitationAcceptance,
    InvitationAnswer,
    InvitationPath,
    InvitationRequest,
    Invitations,
    OrgAnswer,
    OrgMember,
    OrgMemberPath,
    OrgMembers,
    OrgPath,
    OrgRequest,
    OrgRoleChange,
    Orgs,
    OrgsPage,
    OrgsQuery,
    OrgWithMembers,
)

bp = Blueprint("orgs", __name__)

SCOPE = "orgs:manage"
CALLERS = ("bearer", "cookie", "api_key")
USERS = ("bearer", "cookie")
TAGS = ["organizations"]


def _superuser() -> bool:
    """An administrator of the service, or an API key with orgs:manage: an owner of every organization."""
    return current_api_key() is not None or current_caller().is_admin


def _actor() -> str:
    """Who acts, as the store's steps take it: the user's id, or SUPERUSER."""
    return store.SUPERUSER if _superuser() else current_caller().user_id


def _user_id() -> str | None:
    """The calling user's id (None for an API key)."""
    return None if current_api_key() is not None else current_caller().user_id


def members_or_keys(view):
    """Decorate a view for users (what they may do is decided by their role) and orgs:manage keys."""

    @functools.wraps(view)
    @user_or_api_key(SCOPE)
    def wrapper(*args, **kwargs):
        return view(*args, **kwargs)

    return wrapper


def managers_only(view):
    """Decorate a view for administrators and API keys with scope orgs:manage (403 for others)."""

    @functools.wraps(view)
    @user_or_api_key(SCOPE)
    def wrapper(*args, **kwargs):
        if not _superuser():
            raise forbidden(f"Only administrators (or API keys with scope {SCOPE}) may list organizations.")
        return view(*args, **kwargs)

    return wrapper


@bp.post("/orgs")
@operation(
    "Create an organization; the caller is its owner",
    tags=TAGS,
    body=OrgRequest,
    responses={201: OrgAnswer},
    auth=USERS,
)
@login_required
def create_org():
    """A new organization (a verified address needed; ORG_CREATION=admins: administrators only)."""
    name = validated(OrgRequest).name
    caller = current_caller()
    manage.may_create({**caller.user, "role": caller.role})
    return jsonify(manage.create_org(name, caller.user_id)), 201


@bp.get("/orgs")
@operation("The caller's organizations, each with its role", tags=TAGS, responses={200: Orgs}, auth=USERS)
@login_required
def my_orgs():
    """The organizations the caller belongs to, by name."""
    return jsonify({"orgs": store.orgs_of(current_caller().user_id)})


@bp.get("/orgs/<org_id>")
@operation("An organization (members)", tags=TAGS, path=OrgPath, responses={200: OrgAnswer}, auth=CALLERS)
@members_or_keys
def get_org(org_id: str):
    """O, with the caller's role."""
    return jsonify(manage.read_org(org_id, _user_id(), _superuser()))


@bp.patch("/orgs/<org_id>")
@operation(
    "Rename an organization (owners and admins)",
    tags=TAGS,
    path=OrgPath,
    body=OrgRequest,
    responses={200: OrgAnswer},
    auth=CALLERS,
)
@members_or_keys
def rename_org(org_id: str):
    """Rename the organization."""
    name = validated(OrgRequest).name
    return jsonify(manage.rename_org(org_id, _actor(), _user_id(), name))


@bp.delete("/orgs/<org_id>")
@operation(
    "Delete an organization (owners): its invitations go, its members lose its channels",
    tags=TAGS,
    path=OrgPath,
    responses={204: None},
    auth=CALLERS,
)
@members_or_keys
def delete_org(org_id: str):
    """Delete the organization."""
    manage.delete_org(org_id, _actor(), _user_id())
    return "", 204


@bp.get("/orgs/<org_id>/members")
@operation("An organization's members (members)", tags=TAGS, path=OrgPath, responses={200: OrgMembers}, auth=CALLERS)
@members_or_keys
def list_members(org_id: str):
    """The members with their addresses and roles, oldest first."""
    return jsonify({"members": manage.list_members(org_id, _user_id(), _superuser())})


@bp.patch("/orgs/<org_id>/members/<user_id>")
@operation(
    "Change a member's role (owners any; admins between member and admin; never the last owner's)",
    tags=TAGS,
    path=OrgMemberPath,
    body=OrgRoleChange,
    responses={200: OrgMember},
    errors=(409,),
    auth=CALLERS,
)
@members_or_keys
def change_role(org_id: str, user_id: str):
    """Set the member's role; live connections lose channels the new role no longer opens."""
    role = validated(OrgRoleChange).role
    return jsonify(manage.change_role(org_id, _actor(), user_id, role))


@bp.delete("/orgs/<org_id>/members/<user_id>")
@operation(
    "Remove a member, or leave (owners anyone, admins members, anyone itself; never the last owner)",
    tags=TAGS,
    path=OrgMemberPath,
    responses={204: None},
    errors=(409,),
    auth=CALLERS,
)
@members_or_keys
def remove_member(org_id: str, user_id: str):
    """Remove the member: its live connections lose the organization's channels."""
    # Leaving is one's own business, whatever one's powers elsewhere.
    actor = user_id if _user_id() == user_id else _actor()
    manage.remove_member(org_id, actor, user_id)
    return "", 204


@bp.post("/orgs/<org_id>/invitations")
@operation(
    "Invite an address (owners and admins; only owners invite owners): the link is mailed",
    tags=TAGS,
    path=OrgPath,
    body=InvitationRequest,
    responses={201: InvitationAnswer},
    auth=CALLERS,
)
@members_or_keys
def invite(org_id: str):
    """Record an invitation for 7 days and mail its single-use link."""
    asked = validated(InvitationRequest)
    return jsonify(manage.invite(org_id, _actor(), asked.email, asked.role)), 201


@bp.get("/orgs/<org_id>/invitations")
@operation(
    "An organization's open invitations (owners and admins)",
    tags=TAGS,
    path=OrgPath,
    responses={200: Invitations},
    auth=CALLERS,
)
@members_or_keys
def list_invitations(org_id: str):
    """Invitations not used, revoked or expired."""
    return jsonify({"invitations": manage.list_invitations(org_id, _user_id(), _superuser())})


@bp.delete("/orgs/<org_id>/invitations/<inv_id>")
@operation(
    "Revoke an invitation (owners and admins): its link stops working",
    tags=TAGS,
    path=InvitationPath,
    responses={204: None},
    auth=CALLERS,
)
@members_or_keys
def revoke_invitation(org_id: str, inv_id: str):
    """Delete the invitation."""
    manage.revoke_invitation(org_id, _actor(), inv_id)
    return "", 204


@bp.post("/orgs/invitations/accept")
@operation(
    "Accept an invitation with the mailed link's token (the invited, verified address)",
    tags=TAGS,
    body=InvitationAcceptance,
    responses={200: OrgAnswer},
    errors=(400,),
    auth=USERS,
)
@login_required
def accept_invitation():
    """Become a member with the invited role (a member keeps a higher one)."""
    token = validated(InvitationAcceptance).token
    return jsonify(manage.accept_invitation(token, current_caller().user))


@bp.get("/admin/orgs")
@operation(
    "Every organization, newest first (administrators)",
    tags=TAGS,
    query=OrgsQuery,
    responses={200: OrgsPage},
    auth=CALLERS,
)
@managers_only
def admin_orgs():
    """A page of organizations; `next` is the `before` of the page after it."""
    query = validated_query(OrgsQuery)
    orgs, following = store.page(query.before, query.limit)
    return jsonify({"orgs": orgs, "next": following})


@bp.get("/admin/orgs/<org_id>")
@operation(
    "An organization with its members (administrators)",
    tags=TAGS,
    path=OrgPath,
    responses={200: OrgWithMembers},
    auth=CALLERS,
)
@managers_only
def admin_org(org_id: str):
    """O with its members."""
    found = manage.read_org(org_id, None, True)
    return jsonify({**found, "members": store.members(org_id)})


@bp.url_value_preprocessor
def ids_of_the_right_shape(endpoint, values) -> None:
    """404 for a path id of the wrong shape: never a Redis look-up of garbage."""
    for name in ("org_id", "user_id", "inv_id"):
        if values and name in values and not store.ORG_ID.fullmatch(values[name]):
            raise not_found("No such organization, member or invitation.")
