"""auth-rt's Python client for backends: publish events, introspect tokens, manage channels, read events,
verify webhooks, and exchange the application's own tokens for sessions."""

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
from .models import (
    BatchItem,
    Event,
    ExternalIdentity,
    Introspection,
    Member,
    Namespace,
    Presence,
    PresentUser,
    PublishedEvent,
    Tokens,
    User,
)
from .reader import EventReader
from .webhooks import verify_webhook

__all__ = [
    "ApiError",
    "AuthRtError",
    "BatchItem",
    "Client",
    "Event",
    "EventReader",
    "ExternalIdentity",
    "Introspection",
    "Member",
    "Namespace",
    "Presence",
    "PresentUser",
    "ProtocolError",
    "PublishedEvent",
    "ServiceUnreachable",
    "Tokens",
    "User",
    "WebhookVerificationError",
    "verify_webhook",
    "__version__",
]
