"""auth-rt's Python client for backends: publish events, introspect tokens, manage channels, read events,
verify webhooks."""

from __future__ import annotations

from ._version import __version__
from .client import Client
from .errors import (
    ApiError,
    AuthRtError,
    ProtocolError,
    ServiceUnreachable,
    WebhookVerificationError,
)
from .models import BatchItem, Event, Introspection, Member, Namespace, Presence, PresentUser, PublishedEvent
from .reader import EventReader
from .webhooks import verify_webhook

__all__ = [
    "ApiError",
    "AuthRtError",
    "BatchItem",
    "Client",
    "Event",
    "EventReader",
    "Introspection",
    "Member",
    "Namespace",
    "Presence",
    "PresentUser",
    "ProtocolError",
    "PublishedEvent",
    "ServiceUnreachable",
    "WebhookVerificationError",
    "verify_webhook",
    "__version__",
]
