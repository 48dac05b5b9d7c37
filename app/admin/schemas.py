"""What the user-administration endpoints take and answer."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..auth.emails import ADDRESS_MAX
from ..auth.schemas import User
from ..auth.users import ROLES
from ..schemas import Answer, Body


class UserPath(Body):
    """A user id (another shape is 404)."""

    user_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


SEARCH_LIMIT = 50  # users a search by the start of their address answers


class UserQuery(Body):
    """One user by address, users by the start of their address, or a page of users, newest first."""

    email: str | None = Field(None, description="One user by their whole address (any case).")
    q: str | None = Field(
        None,
        max_length=ADDRESS_MAX,
        description=f"The first {SEARCH_LIMIT} users, in ascending e-mail order, whose address starts with this "
        "(any case; empty: the first of all). Not combined with `email`, `limit` or `offset`.",
    )
    limit: int = Field(100, ge=1, le=1000, description="A page of users, newest first: how many.")
    offset: int = Field(0, ge=0, description="A page of users, newest first: how many newer ones to skip.")

    def combination_refused(self) -> str | None:
        """Why the parameters given do not go together, or None: a search answers its first matches only."""
        if self.q is not None and self.model_fields_set & {"email", "limit", "offset"}:
            return (
                f"Query parameter 'q' is not combined with 'email', 'limit' or 'offset': it answers the first "
                f"{SEARCH_LIMIT} users whose address starts with it."
            )
        return None


class RoleChange(Body):
    """The new role."""

    role: Literal[ROLES]


class AdminUser(User):
    """`U` as administrators see it: also when the account was created."""

    created_at: str | None


class AdminUserAnswer(Answer):
    """One user, as administrators see them."""

    user: AdminUser


class AdminUsers(Answer):
    """Users: newest first, or in ascending e-mail order for a search by the start of their address."""

    users: list[AdminUser]
