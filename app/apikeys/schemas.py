"""What `/admin/api-keys` takes and answers (`K` in docs/api.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..channels.patterns import ChannelPatterns
from ..schemas import Answer, Body, PlainText
from .store import CHANNELS_LIMIT, NAME_LIMIT, SCOPES

Scope = Literal[SCOPES]


class KeyRequest(Body):
    """A new key's name, what it may do, and where it may publish."""

    name: Annotated[PlainText, Field(min_length=1, max_length=NAME_LIMIT)]
    scopes: list[Scope] = Field(min_length=1)
    channels: ChannelPatterns = Field([], max_length=CHANNELS_LIMIT)


class KeyPath(Body):
    """A key's id (another shape is 404)."""

    key_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]


class ApiKey(Answer):
    """`K`: a key as listed (never the key itself)."""

    id: str
    name: str
    scopes: list[str]
    channels: list[str]
    created_at: str
    last_used_at: str | None


class CreatedKey(ApiKey):
    """`K` with the key itself, shown this once."""

    key: str = Field(pattern=r"^ak_")


class ApiKeys(Answer):
    """Every key, newest first."""

    api_keys: list[ApiKey]
