"""What the user-administration endpoints take and answer."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..auth.schemas import User
from ..auth.users import ROLES
from ..schemas import Answer, Body


class UserPath(Body):
    """A user id (another shape is 404)."""

    user_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class UserQuery(Body):
    """One user by address, or a page of users, newest first."""

    email: str | None = None
    limit: int = Field(100, ge=1, le=1000)
    offset: int = Field(0, ge=0)


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
    """Users, newest first."""

    users: list[AdminUser]
