"""What the service's answers hold, as typed values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from .errors import ProtocolError


class BatchItem(TypedDict):
    """One event of `Client.publish_batch`."""

    channel: str
    event: str
    data: NotRequired[Any]


@dataclass(frozen=True, slots=True)
class Event:
    """An event `E` as readers receive it (docs/api.md, Events).

    `id` is its position in its channel, `data` any JSON value, `ts` when it was published (RFC 3339).
    An event named `reset` (id `0-0`) says the cursor was older than the kept history: events were lost.
    """

    id: str
    channel: str
    event: str
    data: Any
    ts: str

    @classmethod
    def from_json(cls, value: Any) -> Event:
        """An event from its JSON object; `ProtocolError` if it is not one."""
        try:
            return cls(value["id"], value["channel"], value["event"], value["data"], value["ts"])
        except (KeyError, TypeError) as error:
            raise ProtocolError(f"not an event object: {value!r:.200}") from error

    @property
    def published_at(self) -> datetime:
        """`ts` as an aware datetime (UTC)."""
        return datetime.fromisoformat(self.ts)


@dataclass(frozen=True, slots=True)
class PublishedEvent:
    """The answer to a publish: the new event's id and its channel."""

    id: str
    channel: str


@dataclass(frozen=True, slots=True)
class Introspection:
    """An RFC 7662 introspection answer. Every field but `active` is None for an inactive token."""

    active: bool
    sub: str | None = None
    role: str | None = None
    sid: str | None = None
    ver: int | None = None
    exp: int | None = None
    iat: int | None = None
    iss: str | None = None
    aud: str | list[str] | None = None
    token_type: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> Introspection:
        """The answer's JSON object as an `Introspection`; `ProtocolError` if it has no boolean `active`."""
        if not isinstance(value, dict) or not isinstance(value.get("active"), bool):
            raise ProtocolError(f"not an introspection answer: {value!r:.200}")
        if not value["active"]:
            return cls(active=False, raw=value)
        names = ("sub", "role", "sid", "ver", "exp", "iat", "iss", "aud", "token_type")
        return cls(active=True, raw=value, **{name: value.get(name) for name in names})
