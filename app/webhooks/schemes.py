"""Signature verification, one function per scheme, over the raw body, in constant time.

Each returns the delivery's headers-derived facts or raises SignatureRejected; nothing is parsed
before the signature holds. Several secrets may be configured at once (rotation): any may match.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping

TOLERANCE_SECONDS = 300


class SignatureRejected(Exception):
    """Missing headers, bad signature or a timestamp out of tolerance: answered 401."""


def _hmac_sha256(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _check_timestamp(raw: str | None, now: float) -> int:
    try:
        timestamp = int(raw or "")
    except ValueError:
        raise SignatureRejected("missing or malformed timestamp") from None
    if abs(now - timestamp) > TOLERANCE_SECONDS:
        raise SignatureRejected("timestamp outside the tolerance")
    return timestamp


def standard_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (`whsec_` + base64)."""
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        raise ValueError("a Standard Webhooks secret is 'whsec_' followed by base64") from None


def verify_standard(body: bytes, headers: Mapping[str, str], secrets: list[str], now: float | None = None) -> str:
    """Standard Webhooks: HMAC-SHA256 over `id.timestamp.body`, `v1,<base64>` entries. Returns the id."""
    delivery_id, signatures = headers.get("webhook-id"), headers.get("webhook-signature")
    if not delivery_id or not signatures:
        raise SignatureRejected("missing webhook-id or webhook-signature")
    timestamp = _check_timestamp(headers.get("webhook-timestamp"), time.time() if now is None else now)
    signed = f"{delivery_id}.{timestamp}.".encode() + body
    offered = [entry.partition(",")[2].encode() for entry in signatures.split() if entry.startswith("v1,")]
    for secret in secrets:
        expected = base64.b64encode(_hmac_sha256(standard_key(secret), signed))
        if any(hmac.compare_digest(expected, candidate) for candidate in offered):
            return delivery_id
    raise SignatureRejected("no signature matches")


def verify_stripe(body: bytes, headers: Mapping[str, str], secrets: list[str], now: float | None = None) -> None:
    """Stripe: `Stripe-Signature: t=...,v1=<hex>[,v1=...]`, HMAC-SHA256 over `t.body` keyed by the secret."""
    header = headers.get("Stripe-Signature")
    if not header:
        raise SignatureRejected("missing Stripe-Signature")
    pairs = [item.partition("=") for item in header.split(",")]
    timestamp = _check_timestamp(
        next((v for k, _, v in pairs if k.strip() == "t"), None), time.time() if now is None else now
    )
    offered = [v.strip().encode() for k, _, v in pairs if k.strip() == "v1"]
    signed = f"{timestamp}.".encode() + body
    for secret in secrets:
        expected = _hmac_sha256(secret.encode(), signed).hex().encode()
        if any(hmac.compare_digest(expected, candidate) for candidate in offered):
            return None
    raise SignatureRejected("no signature matches")


def verify_github(body: bytes, headers: Mapping[str, str], secrets: list[str], now: float | None = None) -> str:
    """GitHub: `X-Hub-Signature-256: sha256=<hex>` over the body. Returns the X-GitHub-Delivery id."""
    header, delivery_id = headers.get("X-Hub-Signature-256", ""), headers.get("X-GitHub-Delivery")
    if not header.startswith("sha256=") or not delivery_id or not headers.get("X-GitHub-Event"):
        raise SignatureRejected("missing X-Hub-Signature-256, X-GitHub-Delivery or X-GitHub-Event")
    offered = header.removeprefix("sha256=").encode()
    for secret in secrets:
        if hmac.compare_digest(_hmac_sha256(secret.encode(), body).hex().encode(), offered):
            return delivery_id
    raise SignatureRejected("no signature matches")


VERIFIERS = {"standard": verify_standard, "stripe": verify_stripe, "github": verify_github}
