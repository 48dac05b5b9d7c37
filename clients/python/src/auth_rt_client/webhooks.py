"""Verifying the service's outgoing webhooks: Standard Webhooks signatures (docs/api.md).

Each delivery is signed with HMAC-SHA256 over `{webhook-id}.{webhook-timestamp}.{body}` with the
endpoint's secret (`whsec_` + base64); `webhook-signature` holds one or more space-separated
`v1,<base64>` values (two while a rotated secret overlaps the new one).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import WebhookVerificationError

#: How far `webhook-timestamp` may be from now, in seconds (replays of old deliveries are refused).
TOLERANCE_SECONDS = 300
SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret


def verify_webhook(
    payload: bytes,
    headers: Mapping[str, str],
    secret: str | Sequence[str],
    *,
    tolerance: float = TOLERANCE_SECONDS,
) -> dict[str, Any]:
    """Check a delivery's signature and timestamp, then return its body: the event `E` as a dict.

    `payload` is the raw request body, exactly as received (verify before parsing). `headers` may be any
    mapping (names are matched without regard to case). `secret` is the endpoint's `whsec_...` secret, or
    several (old and new during a rotation): any one may match. Raises `WebhookVerificationError` for a
    missing header, a timestamp more than `tolerance` seconds from now, no matching signature, or a body
    that is not a JSON object; `ValueError` for a secret that is not a `whsec_` secret.
    """
    keys = [decode_secret(value) for value in ([secret] if isinstance(secret, str) else secret)]
    if not keys:
        raise ValueError("no webhook secret given")
    message_id = _header(headers, "webhook-id")
    timestamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")

    if not (timestamp.isascii() and timestamp.isdigit()):
        raise WebhookVerificationError("webhook-timestamp is not an integer number of seconds")
    if abs(time.time() - int(timestamp)) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is too far from now (a stale or replayed delivery)")

    signed = f"{message_id}.{timestamp}.".encode() + payload
    expected = [hmac.new(key, signed, hashlib.sha256).digest() for key in keys]
    if not any(hmac.compare_digest(given, wanted) for given in _v1_signatures(signatures) for wanted in expected):
        raise WebhookVerificationError("no matching signature in webhook-signature")

    try:
        body = json.loads(payload.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as error:
        raise WebhookVerificationError("the body is not JSON") from error
    if not isinstance(body, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    return body


def decode_secret(secret: str) -> bytes:
    """The key bytes of a `whsec_<base64>` secret; ValueError if it is not one."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with 'whsec_'")
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error as error:
        raise ValueError("a webhook secret is 'whsec_' followed by base64") from error
    if not key:
        raise ValueError("empty webhook secret")
    return key


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    if not value:
        raise WebhookVerificationError(f"missing {name} header")
    return value


def _v1_signatures(header: str) -> list[bytes]:
    """The decoded `v1` signatures; other versions and malformed entries are skipped, never an error."""
    decoded = []
    for entry in header.split():
        version, _, signature = entry.partition(",")
        if version != "v1":
            continue
        try:
            decoded.append(base64.b64decode(signature, validate=True))
        except binascii.Error:
            continue
    return decoded


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
