"""What the namespace, membership and presence endpoints take and answer (`N` in docs/api.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..outgoing.ssrf import URL_LIMIT
from ..schemas import Answer, Body, JsonValue
from .grants import EXPIRES_IN_LIMIT, INFO_LIMIT
from .namespaces import CHANNEL_NAME_PATTERN, NAMESPACE_PATTERN, PUBLISH_RULES, SUBSCRIBE_RULES

ChannelName = Annotated[
    str,
    Field(
        pattern=rf"^{NAMESPACE_PATTERN}:{CHANNEL_NAME_PATTERN}$",
        description="`<namespace>:<name>` of an existing namespace (anything else is 404).",
    ),
]
UserId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
Info = Annotated[dict[str, JsonValue], Field(description=f"At most {INFO_LIMIT} bytes as compact JSON (else 422).")]


class NamespacePath(Body):
    """A namespace's name (in PUT, another shape or a reserved name is 422; elsewhere 404)."""

    ns: Annotated[str, Field(pattern=rf"^{NAMESPACE_PATTERN}$")]


class NamespaceRules(Body):
    """A namespace's rules: who subscribes and who publishes are always said (a missing one is 422, never a
    default nobody chose); absent booleans are false."""

    subscribe: Literal[SUBSCRIBE_RULES] = Field(
        description="`proxy`: the application's backend at `proxy_url` is asked about users without a grant. "
        "`org_members` (`org_admins`): the members (owners and admins) of the organization a channel "
        "`<ns>:<org id>` or `<ns>:<org id>.<name>` names."
    )
    publish: Literal[PUBLISH_RULES]
    presence: bool = False
    join_leave: bool = Field(False, description="Needs presence (else 422).")
    presence_diff: bool = Field(
        False,
        description="Needs join_leave (else 422): joins and leaves go out together, as one event `presence.diff` "
        '`{"joins": [...], "leaves": [...]}` every PRESENCE_DIFF_SECONDS, instead of one event per user.',
    )
    proxy_url: str | None = Field(
        None,
        max_length=URL_LIMIT,
        description="With `subscribe: proxy` only, and then needed (else 422): an https URL of a public address "
        "(unless WEBHOOK_OUT_ALLOW_HTTP / WEBHOOK_OUT_ALLOW_PRIVATE allow others), checked now and at every request.",
    )
    rotate_proxy_secret: bool = Field(
        False,
        description="With `subscribe: proxy`: replace the signing secret (answered this once). Without it a proxy "
        "namespace keeps its secret; one that becomes a proxy namespace gets a new one.",
    )


class ChannelPath(Body):
    """A channel of a namespace."""

    channel: ChannelName


class MemberPath(Body):
    """A channel of a namespace and a user's id."""

    channel: ChannelName
    user_id: UserId


class GrantRequest(Body):
    """What a grant shows in presence, and when it runs out (never, without `expires_in`)."""

    info: Info | None = None
    expires_in: float | None = Field(None, gt=0, le=EXPIRES_IN_LIMIT, description="Seconds from now.")


class NamespaceAnswer(Answer):
    """`N`: a namespace and its rules (a proxy namespace's with its `proxy_url`)."""

    name: str
    subscribe: Literal[SUBSCRIBE_RULES]
    publish: Literal[PUBLISH_RULES]
    presence: bool
    join_leave: bool
    presence_diff: bool | None = Field(None, description="Only in N of a namespace where it is true.")
    proxy_url: str | None = Field(None, description="Only in a `proxy` namespace's N.")


class PutNamespaceAnswer(NamespaceAnswer):
    """`N`, and the signing secret of the proxy's requests when this PUT made it (never shown again)."""

    proxy_secret: str | None = Field(
        None, pattern=r"^whsec_[A-Za-z0-9+/=]+$", description="Only when this PUT made a new secret."
    )


class Namespaces(Answer):
    """Every namespace, by name."""

    namespaces: list[NamespaceAnswer]


class Member(Answer):
    """One grant in force."""

    user_id: str
    info: dict[str, JsonValue] | None
    expires_at: str | None = Field(description="RFC 3339; null for a grant that does not run out.")


class Members(Answer):
    """A channel's grants in force, by user id."""

    members: list[Member]


class Channels(Answer):
    """The channels granted to the caller."""

    channels: list[str]


class PresentUser(Answer):
    """A user reading the channel, with the info of their grant."""

    user_id: str
    info: dict[str, JsonValue] | None
    connections: int = Field(ge=1)


class Presence(Answer):
    """Who reads a channel now: at most 1,000 users, by user id; `count` is the whole number."""

    channel: str
    count: int = Field(ge=0)
    users: list[PresentUser]
