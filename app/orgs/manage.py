"""Changes to organizations as the API makes them: refused or made, recorded in the audit log, announced.

`actor` is the acting user's id, or `store.SUPERUSER` for an administrator of the service or an API key
with scope `orgs:manage`, who may do everything an owner does. Who may do what is decided in the store's
step that writes (store.py); this module turns its refusals into answers. An organization is invisible to
those outside it: they get 404, as for one that does not exist.
"""

from __future__ import annotations

from flask import current_app, g, has_request_context

from .. import audit, mail
from ..auth import users
from ..errors import ApiError, forbidden, not_found
from ..redis import Keys, get_redis
from . import store
from .live import announce_org_changed

SUPERUSER = store.SUPERUSER

REFUSALS = {
    "gone": lambda: not_found("No such organization."),
    "outsider": lambda: not_found("No such organization."),
    "not_member": lambda: not_found("No such member of this organization."),
    "unknown": lambda: not_found("No such invitation."),
    "last_owner": lambda: last_owner(),  # defined below
}


def last_owner() -> ApiError:
    """409: the change would leave an organization without an owner."""
    return ApiError(409, "conflict", "This is the organization's last owner: make another member an owner first.")


def _refused(outcome: str, forbidden_message: str) -> ApiError:
    if outcome == "forbidden":
        return forbidden(forbidden_message)
    return REFUSALS[outcome]()


def _acting_user() -> str | None:
    """The signed-in user making the request at hand (None for an API key, the CLI, or no request)."""
    caller = g.get("caller") if has_request_context() and g.get("api_key") is None else None
    return caller.user_id if caller is not None else None


def create_org(name: str, user_id: str) -> dict:
    """A new organization owned by `user_id` (O with its role)."""
    record = store.create(name, user_id)
    if record is None:
        raise not_found("No such user.")
    audit.record("org.created", subject=user_id, details={"org_id": record["id"], "name": name})
    audit.record("org.member_added", subject=user_id, details={"org_id": record["id"], "role": "owner"})
    return store.answer(record, "owner")


def read_org(org_id: str, user_id: str | None, superuser: bool) -> dict:
    """O as its member (with the role) or a superuser sees it; 404 for anyone else."""
    record, role = store.get(org_id, user_id)
    if record is None or (role is None and not superuser):
        raise not_found("No such organization.")
    return store.answer(record, role)


def rename_org(org_id: str, actor: str, user_id: str | None, name: str) -> dict:
    """Rename (owners and admins); O. `user_id`: the caller's (None for an API key)."""
    outcome = store.rename(org_id, actor, name)
    if outcome != "ok":
        raise _refused(outcome, "Only the organization's owners and admins may rename it.")
    audit.record("org.updated", subject=user_id, details={"org_id": org_id, "name": name})
    return read_org(org_id, user_id, True)


def delete_org(org_id: str, actor: str, user_id: str | None) -> None:
    """Delete the organization (owners): its members lose its channels at once. `user_id`: the caller's."""
    outcome, _ = store.delete(org_id, actor)
    if outcome != "deleted":
        raise _refused(outcome, "Only the organization's owners may delete it.")
    audit.record("org.deleted", subject=user_id, details={"org_id": org_id})
    announce_org_changed(org_id)


def list_members(org_id: str, user_id: str | None, superuser: bool) -> list[dict]:
    """The members, for a member or a superuser."""
    read_org(org_id, user_id, superuser)
    return store.members(org_id)


def change_role(org_id: str, actor: str, user_id: str, role: str) -> dict:
    """Set a member's role (owners any, admins between member and admin; never the last owner's)."""
    outcome, before = store.set_role(org_id, actor, user_id, role)
    if outcome not in ("changed", "same"):
        raise _refused(outcome, "Owners set any role; admins only make members admins and admins members.")
    if outcome == "changed":
        details = {"org_id": org_id, "role": role, "previous_role": before}
        audit.record("org.role_changed", subject=user_id, details=details)
        announce_org_changed(org_id, user_id)
    found = store.member(org_id, user_id)
    if found is None:  # removed in the meantime
        raise not_found("No such member of this organization.")
    return found


def remove_member(org_id: str, actor: str, user_id: str) -> None:
    """Remove a member (owners anyone, admins members, anyone itself; never the last owner)."""
    outcome, role = store.remove(org_id, actor, user_id)
    if outcome != "removed":
        raise _refused(outcome, "Owners remove anyone, admins remove members; anyone may leave.")
    details = {"org_id": org_id, "role": role, **({"left": True} if actor == user_id else {})}
    audit.record("org.member_removed", subject=user_id, details=details)
    announce_org_changed(org_id, user_id)


def invite(org_id: str, actor: str, email: str, role: str) -> dict:
    """Invite an address (owners and admins; an admin not as an owner) and mail it the link; V."""
    email = users.validate_email(email)
    outcome, answer = store.invite(org_id, actor, email, role)
    if outcome != "ok":
        raise _refused(outcome, "Owners and admins invite; only owners invite owners.")
    details = {"org_id": org_id, "invitation_id": answer["id"], "role": role}
    audit.record("org.invitation_created", subject=_account_of(email), details=details)
    mail.queue_mail(mail.ORG_INVITATION, email=email, org_id=org_id, invitation_id=answer["id"])
    return answer


def list_invitations(org_id: str, user_id: str | None, superuser: bool) -> list[dict]:
    """The open invitations, for owners, admins and superusers."""
    record, role = store.get(org_id, user_id)
    if record is None or (role is None and not superuser):
        raise not_found("No such organization.")
    if not superuser and role not in ("owner", "admin"):
        raise forbidden("Only the organization's owners and admins see its invitations.")
    return store.invitations(org_id)


def revoke_invitation(org_id: str, actor: str, invitation_id: str) -> None:
    """Delete an open invitation (owners and admins): its link stops working."""
    held = store.invitation(org_id, invitation_id)
    outcome = store.revoke_invitation(org_id, actor, invitation_id)
    if outcome != "ok":
        raise _refused(outcome, "Only the organization's owners and admins revoke invitations.")
    details = {"org_id": org_id, "invitation_id": invitation_id}
    audit.record("org.invitation_revoked", subject=_account_of(held["email"]) if held else None, details=details)


def _account_of(email: str) -> str | None:
    """The id of the account with this address, if there is one (an invitation's subject)."""
    user_id = users.find_user_id_by_email(email)
    return user_id if user_id and users.get_user(user_id) else None


def invalid_token() -> ApiError:
    """400: the link's token is used, expired, revoked or unknown."""
    return ApiError(400, "invalid_token", "This invitation link is not valid: it was used, revoked or has expired.")


def accept_invitation(token: str, user: dict) -> dict:
    """The signed-in user (U) accepts an invitation meant for their verified address: O with their role."""
    parsed = store.parse_token(token)
    if parsed is None:
        raise invalid_token()
    if not user.get("email_verified"):
        raise forbidden(
            "Verify your e-mail address first: invitations are accepted by verified addresses.", "email_not_verified"
        )
    org_id, invitation_id, secret = parsed
    outcome, *roles = store.accept(org_id, invitation_id, secret, user["id"], users.normalise_email(user["email"]))
    if outcome == "invalid":
        raise invalid_token()
    if outcome == "wrong_email":
        raise forbidden("This invitation was sent to another e-mail address than your account's.")
    role, before, invited = roles
    details = {"org_id": org_id, "invitation_id": invitation_id, "role": invited}
    audit.record("org.invitation_accepted", subject=user["id"], details=details)
    if outcome == "added":
        if not store.index(user["id"], org_id, role):
            store.unindex(org_id, user["id"])  # the account is being deleted
            raise not_found("No such user.")
        audit.record("org.member_added", subject=user["id"], details={"org_id": org_id, "role": role})
    elif outcome == "upgraded":
        store.index(user["id"], org_id, role)
        details = {"org_id": org_id, "role": role, "previous_role": before}
        audit.record("org.role_changed", subject=user["id"], details=details)
        announce_org_changed(org_id, user["id"])
    return read_org(org_id, user["id"], False)


def leave_all(user_id: str, gone: bool = False) -> None:
    """Before a user's account is deleted: 409 when it is the last owner of an organization with other
    members; otherwise its memberships end and organizations it alone belongs to are deleted.

    Called again once the account is gone (`gone`), for memberships made in between (an invitation accepted
    meanwhile): no refusal then, nothing can be undone.
    """
    org_ids = store.memberships(user_id)
    if not gone and any(store.leave_with_account(o, user_id, dry_run=True)[0] == "last_owner" for o in org_ids):
        raise ApiError(
            409,
            "conflict",
            "This user is the last owner of an organization that has other members: make another member an "
            "owner (or remove the others) first.",
        )
    for org_id in org_ids:
        outcome, role = store.leave_with_account(org_id, user_id, dry_run=False)
        if outcome == "last_owner" and not gone:  # the organization changed since the check
            raise last_owner()
        if outcome == "deleted":
            details = {"org_id": org_id, "with_account": True}
            audit.record("org.deleted", subject=_acting_user(), details=details)
            announce_org_changed(org_id)
        elif outcome == "removed":
            details = {"org_id": org_id, "role": role, "with_account": True}
            audit.record("org.member_removed", subject=user_id, details=details)
            announce_org_changed(org_id, user_id)
    if gone:
        get_redis().delete(Keys.user_orgs(user_id))


def may_create(user: dict) -> None:
    """403 unless the caller (U) may create organizations: ORG_CREATION, and a verified address (which
    administrators, made by operators, need not have)."""
    admin = user.get("role") == "admin"
    if current_app.config["SETTINGS"].org_creation == "admins" and not admin:
        raise forbidden("Only administrators may create organizations here.")
    if not admin and not user.get("email_verified"):
        raise forbidden("Verify your e-mail address first.", "email_not_verified")
