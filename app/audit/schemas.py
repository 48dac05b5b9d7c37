"""What the audit endpoints take and answer (`A` in docs/api.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..schemas import Answer, Body
from .entries import ENTRY_ID_PATTERN, TYPES

USER_ID_PATTERN = r"^[0-9a-f]{32}$"
EntryType = Literal[TYPES]


class ActivityQuery(Body):
    """A page of entries: those older than `before`, at most `limit`."""

    before: Annotated[str, Field(pattern=ENTRY_ID_PATTERN)] | None = Field(
        None, description="Only entries older than this one: the `next` of the page before."
    )
    limit: int = Field(100, ge=1, le=500)


class AuditQuery(ActivityQuery):
    """A page of the audit log, filtered by any of subject, type and actor."""

    subject: Annotated[str, Field(pattern=USER_ID_PATTERN)] | None = Field(None, description="A user id.")
    type: EntryType | None = None
    actor: Annotated[str, Field(pattern=r"^([0-9a-f]{32}|cli|system)$")] | None = Field(
        None, description="Who made the changes: a user id or an API key id (or cli, or system)."
    )


class AuditActor(Answer):
    """Who made the change: a user (the one concerned, or an administrator), an API key, the CLI or the system."""

    kind: Literal["user", "api_key", "cli", "system"]
    id: str | None


class AuditEntry(Answer):
    """`A`: one security-relevant change."""

    id: str = Field(pattern=ENTRY_ID_PATTERN)
    at: str
    type: EntryType
    actor: AuditActor
    subject: str | None = Field(None, description="The user the entry is about (absent when none is).")
    ip: str | None = Field(None, description="The client's address (absent for the CLI and the system).")
    details: dict


class AuditPage(Answer):
    """Entries newest first, and the `before` of the next page (null when nothing older matches)."""

    entries: list[AuditEntry]
    next: str | None
