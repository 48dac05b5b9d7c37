"""What the outgoing-webhook endpoints take and answer (docs/api.md, Webhooks sent)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ..channels.patterns import ChannelPatterns
from ..schemas import Answer, Body, PlainText

# An event-name pattern: event-name characters, `*` standing for any run of them (`order.*`).
EventPattern = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:*-]{1,100}$")]
ENDPOINT_ID_PATTERN = r"^ep_[0-9a-f]{32}$"
MESSAGE_ID_PATTERN = r"^msg_[a-z2-7]{26}$"


class CreateEndpoint(Body):
    """A new endpoint: where to send, and which events."""

    url: str = Field(max_length=2000, description="https:// (http:// only where the service allows it)")
    channels: ChannelPatterns = Field(min_length=1, max_length=100)
    events: list[EventPattern] | None = Field(default=None, min_length=1, max_length=100)
    description: PlainText | None = Field(default=None, max_length=500)


class UpdateEndpoint(Body):
    """Any of an endpoint's settings; what is absent stays (`events: null` sends every event again)."""

    url: str | None = Field(default=None, max_length=2000)
    channels: ChannelPatterns | None = Field(default=None, min_length=1, max_length=100)
    events: list[EventPattern] | None = Field(default=None, min_length=1, max_length=100)
    description: PlainText | None = Field(default=None, max_length=500)
    disabled: bool | None = None


class Replay(Body):
    """Where a replay starts: a cursor of the events API, or a time (RFC 3339)."""

    cursor: str | None = Field(default=None, max_length=2048)
    since: str | None = Field(default=None, max_length=64, examples=["2026-01-01T00:00:00Z"])


class MessagesQuery(Body):
    """Which of an endpoint's messages to list."""

    status: Literal["pending", "delivered", "failed"] | None = None
    limit: int = Field(default=50, ge=1, le=1000)


class EndpointPath(Body):
    """An endpoint's id in the path."""

    id: str = Field(pattern=ENDPOINT_ID_PATTERN)


class MessagePath(Body):
    """An endpoint's id and one of its messages' ids in the path."""

    id: str = Field(pattern=ENDPOINT_ID_PATTERN)
    msg_id: str = Field(pattern=MESSAGE_ID_PATTERN)


class Endpoint(Answer):
    """W: an endpoint (its secret only at creation and rotation)."""

    id: str
    url: str
    channels: list[str]
    events: list[str] | None
    description: str | None
    disabled: bool
    created_at: str


class CreatedEndpoint(Endpoint):
    """W with its signing secret, shown this once."""

    secret: str = Field(pattern=r"^whsec_[A-Za-z0-9+/=]+$")


class Endpoints(Answer):
    """Every endpoint."""

    endpoints: list[Endpoint]


class NewSecret(Answer):
    """The endpoint's new secret; the previous one also signs during the overlap."""

    secret: str


class Attempt(Answer):
    """One attempt to deliver a message."""

    at: str
    status_code: int | None
    duration_ms: int
    error: str | None


class Message(Answer):
    """M: one event on its way to one endpoint; `id` is the `webhook-id` it is sent with."""

    id: str
    event_id: str
    channel: str
    event: str
    status: Literal["pending", "delivered", "failed"]
    created_at: str
    attempts: list[Attempt]
    next_attempt_at: str | None


class Messages(Answer):
    """An endpoint's messages, newest first (pending ones oldest first)."""

    messages: list[Message]


class Accepted(Answer):
    """The request is taken; the sending happens in the background."""

    status: Literal["accepted"]
    messages: int = Field(description="How many messages were queued.")
