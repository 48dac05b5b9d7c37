"""auth-rt's Python client for backends and scripts: publish events, introspect tokens, manage channels, read
events, verify webhooks, exchange the application's own tokens for sessions, and log in (tokens renewed by
themselves)."""

from __future__ import annotations

from ._version import __version__
from .client import Client
from .errors import (
    ApiError,
    AuthRtError,
    LoginRequired,
    MfaRequired,
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
    "LoginRequired",
    "Member",
    "MfaRequired",
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
