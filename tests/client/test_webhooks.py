"""`verify_webhook` against deliveries signed by the Standard Webhooks reference library (independently)."""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

import pytest
from auth_rt_client import WebhookVerificationError, verify_webhook
from standardwebhooks import Webhook

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
NEW_SECRET = "whsec_" + base64.b64encode(b"n" * 32).decode()
EVENT = {"id": "1764000000000-0", "channel": "user:42", "event": "order.paid", "data": {"total": 42}, "ts": "x"}
BODY = json.dumps(EVENT).encode()


def sign(body: bytes = BODY, secret: str = SECRET, msg_id: str = "msg_1", at: float | None = None) -> dict:
    """The headers the service sends, signed by the reference library."""
    timestamp = int(time.time() if at is None else at)
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, tz=UTC), body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp), "webhook-signature": signature}


def test_a_signed_delivery_gives_the_event():
    assert verify_webhook(BODY, sign(), SECRET) == EVENT


def test_header_names_are_matched_without_regard_to_case():
    headers = {name.title(): value for name, value in sign().items()}
    assert verify_webhook(BODY, headers, SECRET) == EVENT


def test_during_a_rotation_either_secret_matches():
    both = f"{sign(secret=SECRET)['webhook-signature']} {sign(secret=NEW_SECRET)['webhook-signature']}"
    headers = {**sign(), "webhook-signature": both}
    assert verify_webhook(BODY, headers, NEW_SECRET) == EVENT
    assert verify_webhook(BODY, sign(secret=NEW_SECRET), [SECRET, NEW_SECRET]) == EVENT  # receiver holds both
    with pytest.raises(WebhookVerificationError):
        verify_webhook(BODY, sign(secret=NEW_SECRET), SECRET)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda h: (BODY.replace(b"42", b"43"), h),
        lambda h: (BODY, {**h, "webhook-id": "msg_2"}),
        lambda h: (BODY, {**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) + 1)}),
        lambda h: (BODY, sign(secret="whsec_" + base64.b64encode(b"x" * 32).decode())),
        lambda h: (BODY, {**h, "webhook-signature": h["webhook-signature"].replace("v1,", "v2,")}),
        lambda h: (BODY, {**h, "webhook-signature": "v1"}),
        lambda h: (BODY, {**h, "webhook-signature": "v1,not*base64 v1, ,,, v1,AAAA"}),
        lambda h: (BODY, {k: v for k, v in h.items() if k != "webhook-signature"}),
        lambda h: (BODY, {k: v for k, v in h.items() if k != "webhook-id"}),
        lambda h: (BODY, {k: v for k, v in h.items() if k != "webhook-timestamp"}),
        lambda h: (BODY, {**h, "webhook-timestamp": h["webhook-timestamp"] + ".0"}),
    ],
    ids=[
        "body",
        "id",
        "timestamp",
        "other secret",
        "unknown version",
        "no signature value",
        "malformed entries",
        "no signature",
        "no id",
        "no timestamp",
        "fractional timestamp",
    ],
)
def test_anything_altered_or_missing_is_refused(tamper):
    body, headers = tamper(sign())
    with pytest.raises(WebhookVerificationError):
        verify_webhook(body, headers, SECRET)


@pytest.mark.parametrize("offset", [-301, 301, -3600])
def test_a_timestamp_more_than_five_minutes_away_is_refused_even_when_signed(offset):
    with pytest.raises(WebhookVerificationError, match="timestamp"):
        verify_webhook(BODY, sign(at=time.time() + offset), SECRET)
    assert verify_webhook(BODY, sign(at=time.time() + offset), SECRET, tolerance=3700) == EVENT


@pytest.mark.parametrize("body", [b"[1, 2]", b"NaN", b"not json", b"\xff\xfe", b'{"a": Infinity}'])
def test_a_signed_body_that_is_not_a_json_object_is_refused(body):
    with pytest.raises(WebhookVerificationError, match="JSON"):
        verify_webhook(body, sign(body=body) if body != b"\xff\xfe" else raw_sign(body), SECRET)


def raw_sign(body: bytes) -> dict:
    """Headers for a body that is not UTF-8 (the reference library signs text only): HMAC by hand."""
    import hashlib
    import hmac

    timestamp = str(int(time.time()))
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, f"msg_1.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


@pytest.mark.parametrize("secret", ["s3cret", "whsec_", "whsec_***", []])
def test_a_secret_that_is_not_a_whsec_secret_is_a_value_error(secret):
    with pytest.raises(ValueError):
        verify_webhook(BODY, sign(), secret)
