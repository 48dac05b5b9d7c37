"""What the organization endpoints take and answer (`O`, `V` and members in docs/api.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..schemas import Answer, Body, PlainText
from .store import NAME_LIMIT, ORG_ID_PATTERN, ROLES

Role = Literal[ROLES]
OrgId = Annotated[str, Field(pattern=rf"^{ORG_ID_PATTERN}$")]
UserId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
InvitationId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
OrgName = Annotated[PlainText, Field(min_length=1, max_length=NAME_LIMIT)]


class OrgPath(Body):
    """An organization's id (another shape is 404)."""

    org_id: OrgId


class OrgMemberPath(Body):
    """An organization's id and a member's user id."""

    org_id: OrgId
    user_id: UserId


class InvitationPath(Body):
    """An organization's id and one of its invitations' ids."""

    org_id: OrgId
    inv_id: InvitationId


class OrgRequest(Body):
    """An organization's name: 1-100 characters, no control characters (else 422)."""

    name: OrgName


class OrgRoleChange(Body):
    """A member's new role."""

    role: Role


class InvitationRequest(Body):
    """Whom to invite (one plain address, else 422) and with what role."""

    email: Annotated[str, Field(max_length=254)]
    role: Role = "member"


class InvitationAcceptance(Body):
    """The token of the mailed link."""

    token: Annotated[str, Field(min_length=1, max_length=300)]


class OrgsQuery(Body):
    """A page of organizations: those created before the cursor `before`, at most `limit`."""

    before: Annotated[str, Field(pattern=r"^[0-9]{13}-[0-9a-f]{32}$")] | None = Field(
        None, description="Only organizations older than this point: the `next` of the page before."
    )
    limit: int = Field(100, ge=1, le=500)


class OrgAnswer(Answer):
    """`O`: an organization, with the caller's `role` when the caller is a member."""

    id: str
    name: str
    created_at: str
    role: Role | None = Field(None, description="The caller's role (absent when the caller is no member).")


class Orgs(Answer):
    """The caller's organizations, each with its role."""

    orgs: list[OrgAnswer]


class OrgsPage(Answer):
    """Organizations newest first, and the `before` of the next page (null when nothing older is left)."""

    orgs: list[OrgAnswer]
    next: str | None


class OrgMember(Answer):
    """A member: its user id, address (null for an account without one), role and when it joined."""

    user_id: str
    email: str | None
    role: Role
    joined_at: str


class OrgMembers(Answer):
    """The organization's members, oldest first."""

    members: list[OrgMember]


class OrgWithMembers(OrgAnswer):
    """`O` with its members (administrators' view)."""

    members: list[OrgMember]


class InvitationAnswer(Answer):
    """`V`: an open invitation (never its token)."""

    id: str
    email: str
    role: Role
    created_at: str
    expires_at: str


class Invitations(Answer):
    """The organization's open invitations, oldest first."""

    invitations: list[InvitationAnswer]
