"""Endpoint secrets and the Standard Webhooks headers of one attempt.

Signing is the `standardwebhooks` library's own (`Webhook.sign`), the same code receivers verify with,
so the two cannot disagree on the signed text (`<webhook-id>.<webhook-timestamp>.<body>`).
"""

from __future__ import annotations

import base64
import secrets
from datetime import UTC, datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix, not a secret
SECRET_BYTES = 32  # 256 bits; the standard asks for 24 to 64


def new_secret() -> str:
    """A fresh endpoint secret: `whsec_` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signature_headers(message_id: str, body: str, signing_secrets: list[str], now: float) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` (one `v1,` entry per secret, space separated)."""
    moment = datetime.fromtimestamp(int(now), tz=UTC)
    signatures = [Webhook(secret).sign(message_id, moment, body) for secret in signing_secrets]
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now)),
        "webhook-signature": " ".join(signatures),
    }
