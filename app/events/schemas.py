"""What the event endpoints take and answer (`E` in docs/api.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from ..schemas import Answer, Body, JsonValue
from .bus import CHANNEL_PATTERN, EVENT_NAME_PATTERN, RESERVED_MESSAGE, is_reserved_event_name
from .cursor import MAX_CURSOR_LENGTH

BATCH_LIMIT = 100
POLL_LIMIT_DEFAULT, POLL_LIMIT_MAX = 100, 1000

Channel = Annotated[str, Field(pattern=CHANNEL_PATTERN.pattern, examples=["broadcast"])]


def not_reserved(event: str) -> str:
    """An event name anyone may publish: not one of those the service itself sends (422)."""
    if is_reserved_event_name(event):
        raise ValueError(RESERVED_MESSAGE)
    return event


EventName = Annotated[
    str,
    Field(
        pattern=EVENT_NAME_PATTERN.pattern,
        examples=["order.created"],
        description="Not one the service itself sends, in any letter case: reset, session_ended, subscribed, "
        "unsubscribed, welcome, error, ack, pong, presence.*",
    ),
    AfterValidator(not_reserved),
]
Cursor = Annotated[str, Field(max_length=MAX_CURSOR_LENGTH, description="Where the previous answer ended (opaque).")]
ChannelList = Annotated[
    str,
    Field(
        max_length=16384,
        description="Named channels to read besides the caller's own, comma separated (`chat:room1,chat:room2`).",
        examples=["chat:lobby"],
    ),
]


class Publication(Body):
    """One event to append to a channel."""

    channel: Channel
    event: EventName
    data: JsonValue = None


class Batch(Body):
    """Events appended in one atomic step: all of them or none."""

    events: list[Publication] = Field(min_length=1, max_length=BATCH_LIMIT)


class Position(Body):
    """Where to start reading (polling)."""

    cursor: Cursor | None = None
    channels: ChannelList | None = None
    limit: int = Field(POLL_LIMIT_DEFAULT, ge=1, le=POLL_LIMIT_MAX, description="At most this many events.")


class Wait(Position):
    """Where to start reading and how long to wait for something new (long polling)."""

    timeout: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="Seconds (default and maximum: the service's settings)."
    )


class StreamPosition(Body):
    """Where to start streaming; a `Last-Event-ID` header takes precedence."""

    cursor: Cursor | None = None
    channels: ChannelList | None = None


class Published(Answer):
    """The stored event's id and channel."""

    id: str
    channel: str


class PublishedBatch(Answer):
    """The stored events' ids, in the order given."""

    ids: list[str]


class Event(Answer):
    """`E`: one event."""

    id: str
    channel: str
    event: str
    data: JsonValue
    ts: str
    from_: str | None = Field(None, alias="from", description="The user who published it with an access token.")


class Events(Answer):
    """Events after the cursor, and the cursor after the last of them."""

    events: list[Event]
    cursor: str
