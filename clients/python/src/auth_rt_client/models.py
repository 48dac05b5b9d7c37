"""What the service's answers hold, as typed values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    `sender` is the wire's `from`: the id of the user whose access token published it, None when an API
    key, the CLI or a webhook did (and for the service's own events, such as `presence.join`).
    An event named `reset` (id `0-0`) says the cursor was older than the kept history: events were lost.
    """

    id: str
    channel: str
    event: str
    data: Any
    ts: str
    sender: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> Event:
        """An event from its JSON object; `ProtocolError` if it is not one."""
        try:
            sender = value.get("from")
            if sender is not None and not isinstance(sender, str):
                raise TypeError("from")
            return cls(value["id"], value["channel"], value["event"], value["data"], value["ts"], sender)
        except (KeyError, TypeError, AttributeError) as error:
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


@dataclass(frozen=True, slots=True)
class Namespace:
    """A namespace `N`: who may subscribe to its channels and publish to them, and whether they keep presence.

    `subscribe` is `members` (the users granted a channel) or `authenticated` (every logged-in user);
    `publish` is `server` (admins and API keys) or `subscribers` (also every user who may subscribe).
    """

    name: str
    subscribe: str
    publish: str
    presence: bool
    join_leave: bool

    @classmethod
    def from_json(cls, value: Any) -> Namespace:
        """A namespace from its JSON object; `ProtocolError` if it is not one."""
        try:
            namespace = cls(value["name"], value["subscribe"], value["publish"], value["presence"], value["join_leave"])
        except (KeyError, TypeError) as error:
            raise ProtocolError(f"not a namespace object: {value!r:.200}") from error
        if not all(isinstance(text, str) for text in (namespace.name, namespace.subscribe, namespace.publish)):
            raise ProtocolError(f"not a namespace object: {value!r:.200}")
        return namespace


@dataclass(frozen=True, slots=True)
class Member:
    """One user's grant of a channel: `info` (any JSON object, shown in presence) and when it runs out.

    `expires_at` is as the service gives it (None for a grant without `expires_in`).
    """

    user_id: str
    info: Any = None
    expires_at: Any = None

    @classmethod
    def from_json(cls, value: Any) -> Member:
        """A member from its JSON object; `ProtocolError` if it is not one."""
        try:
            member = cls(value["user_id"], value.get("info"), value.get("expires_at"))
        except (KeyError, TypeError, AttributeError) as error:
            raise ProtocolError(f"not a member object: {value!r:.200}") from error
        if not isinstance(member.user_id, str):
            raise ProtocolError(f"not a member object: {value!r:.200}")
        return member

    @property
    def expires(self) -> datetime | None:
        """`expires_at` as an aware datetime (UTC), from epoch seconds or RFC 3339; None without one."""
        if self.expires_at is None:
            return None
        if isinstance(self.expires_at, int | float):
            return datetime.fromtimestamp(self.expires_at, UTC)
        return datetime.fromisoformat(str(self.expires_at))


@dataclass(frozen=True, slots=True)
class PresentUser:
    """A user present in a channel: its grant's `info` (or None), and how many connections read the channel."""

    user_id: str
    info: Any
    connections: int


@dataclass(frozen=True, slots=True)
class Presence:
    """Who is in a channel now. `users` holds at most 1,000, sorted by user id; `count` is the whole number."""

    channel: str
    count: int
    users: tuple[PresentUser, ...]

    @classmethod
    def from_json(cls, value: Any) -> Presence:
        """The presence answer's JSON object; `ProtocolError` if it is not one."""
        try:
            users = tuple(
                PresentUser(user["user_id"], user.get("info"), user["connections"]) for user in value["users"]
            )
            presence = cls(value["channel"], value["count"], users)
        except (KeyError, TypeError, AttributeError) as error:
            raise ProtocolError(f"not a presence answer: {value!r:.200}") from error
        if not isinstance(presence.count, int) or not isinstance(presence.channel, str):
            raise ProtocolError(f"not a presence answer: {value!r:.200}")
        return presence

    @property
    def user_ids(self) -> list[str]:
        """The ids of `users`, in order."""
        return [user.user_id for user in self.users]
