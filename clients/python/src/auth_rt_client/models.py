"""What the service's answers hold, as typed values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
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

    `subscribe` is `members` (the users granted a channel), `authenticated` (every logged-in user) or `proxy`
    (the granted users, and those the application's backend at `proxy_url` allows when they subscribe);
    `publish` is `server` (admins and API keys) or `subscribers` (also every user who may subscribe).
    `proxy_secret` (`whsec_...`, which signs the requests to `proxy_url`) is only in the answer of the
    `put_namespace` that made it: keep it then, it is not shown again.
    """

    name: str
    subscribe: str
    publish: str
    presence: bool
    join_leave: bool
    proxy_url: str | None = None
    proxy_secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, value: Any) -> Namespace:
        """A namespace from its JSON object; `ProtocolError` if it is not one."""
        try:
            namespace = cls(
                value["name"],
                value["subscribe"],
                value["publish"],
                value["presence"],
                value["join_leave"],
                value.get("proxy_url"),
                value.get("proxy_secret"),
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ProtocolError(f"not a namespace object: {value!r:.200}") from error
        texts = (namespace.name, namespace.subscribe, namespace.publish)
        optional = (namespace.proxy_url, namespace.proxy_secret)
        if not all(isinstance(text, str) for text in texts) or not all(_optional_str(text) for text in optional):
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


@dataclass(frozen=True, slots=True)
class ExternalIdentity:
    """Who a user is at a trusted issuer: the issuer's name in the service, and the `sub` its tokens give."""

    issuer: str
    sub: str


@dataclass(frozen=True, slots=True)
class User:
    """A user `U` as the service describes one. `email` is None for a user of a trusted issuer whose token
    named no address; `external` is set only for such users (made by a token exchange)."""

    id: str
    email: str | None
    role: str
    external: ExternalIdentity | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> User:
        """A user from its JSON object; `ProtocolError` if it is not one."""
        try:
            external = value.get("external")
            identity = ExternalIdentity(external["issuer"], external["sub"]) if external is not None else None
            user = cls(value["id"], value.get("email"), value["role"], identity, value)
        except (KeyError, TypeError, AttributeError) as error:
            raise ProtocolError(f"not a user object: {value!r:.200}") from error
        texts = (user.id, user.role) + ((identity.issuer, identity.sub) if identity else ())
        if not all(isinstance(text, str) for text in texts) or not _optional_str(user.email):
            raise ProtocolError(f"not a user object: {value!r:.200}")
        return user


@dataclass(frozen=True, slots=True)
class Tokens:
    """A session's tokens, as every way of logging in answers them (`T`, body transport).

    Send `access_token` as `Authorization: Bearer` (e.g. to `EventReader`) until `expires_at`; the session is
    `session_id`, and `refresh_token` renews it (None if the service gave none). `issued_token_type` is set by a
    token exchange (RFC 8693). `device_token` (from a password login) marks this device as one that logged in to
    the account before; a `Client` sends it back at its next login to the account. No token shows in `repr`.
    """

    access_token: str = field(repr=False)
    refresh_token: str | None = field(repr=False)
    token_type: str
    expires_in: int
    refresh_expires_in: int | None
    session_id: str
    user: User
    expires_at: datetime
    issued_token_type: str | None = None
    device_token: str | None = field(default=None, repr=False)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, value: Any) -> Tokens:
        """The tokens of a login's JSON answer (`expires_at` counted from now); `ProtocolError` if it is not one."""
        try:
            tokens = cls(
                access_token=value["access_token"],
                refresh_token=value.get("refresh_token"),
                token_type=value["token_type"],
                expires_in=value["expires_in"],
                refresh_expires_in=value.get("refresh_expires_in"),
                session_id=value["session_id"],
                user=User.from_json(value["user"]),
                expires_at=datetime.now(UTC) + timedelta(seconds=value["expires_in"]),
                issued_token_type=value.get("issued_token_type"),
                device_token=value.get("device_token"),
                raw=value,
            )
        except (KeyError, TypeError, AttributeError) as error:
            raise ProtocolError("not a token answer") from error  # never the value: it holds tokens
        texts = (tokens.access_token, tokens.token_type, tokens.session_id)
        optional = (tokens.refresh_token, tokens.issued_token_type, tokens.device_token)
        numbers_valid = isinstance(tokens.expires_in, int) and isinstance(tokens.refresh_expires_in, int | None)
        if not all(isinstance(text, str) for text in texts) or not all(_optional_str(o) for o in optional):
            raise ProtocolError("not a token answer")
        if not numbers_valid or isinstance(tokens.expires_in, bool) or tokens.expires_in <= 0:
            raise ProtocolError("not a token answer")
        return tokens


def _optional_str(value: Any) -> bool:
    return value is None or isinstance(value, str)
