"""Reading JSON request bodies strictly: one place that turns bad input into a clear 4xx."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from flask import current_app, request

from .errors import ApiError, bad_request


def json_body(optional: bool = False) -> dict:
    """The request body as a JSON object; 415 if it is not JSON, 400 if it is malformed."""
    if optional and not request.content_length and not request.mimetype:
        return {}
    if request.mimetype != "application/json":
        raise ApiError(415, "unsupported_media_type", "The body must be JSON (Content-Type: application/json).")
    raw = read_body(current_app.config["MAX_CONTENT_LENGTH"])
    if optional and not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise bad_request("The body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise bad_request("The body must be a JSON object.")
    return body


def read_body(limit: int) -> bytes:
    """The raw body, refused with 413 above `limit` bytes, also when it arrives chunked.

    Werkzeug refuses a larger Content-Length at once but stops reading a chunked body at the limit
    without saying so; reading one byte past the limit tells "too large" from "fits".
    """
    request.max_content_length = limit + 1
    raw = request.get_data(cache=True)
    if len(raw) > limit:
        raise ApiError(413, "payload_too_large", f"The body is larger than {limit} bytes.")
    return raw


def field(body: dict, name: str, kind: type = str, required: bool = True, default=None):
    """One field of a JSON object, of the given type; 400 when missing or of another type."""
    if name not in body or body[name] is None:
        if required:
            raise bad_request(f"Field '{name}' is required.")
        return default
    value = body[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"Field '{name}' must be of type {kind.__name__}.")
    return value


def rfc3339(epoch: float | str | None) -> str | None:
    """An epoch time as an RFC 3339 UTC string."""
    if epoch in (None, ""):
        return None
    moment = datetime.fromtimestamp(float(epoch), tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
