"""Cursors: an opaque string holding the last delivered stream id of each of the reader's channels."""

from __future__ import annotations

import base64
import json
import re

from ..errors import bad_request

STREAM_ID = re.compile(r"^\d{1,20}-\d{1,20}$")
MAX_CURSOR_LENGTH = 2048


def parse_id(stream_id: str) -> tuple[int, int]:
    milliseconds, _, sequence = stream_id.partition("-")
    return int(milliseconds), int(sequence or 0)


def is_after(stream_id: str, position: str) -> bool:
    return parse_id(stream_id) > parse_id(position)


def encode_cursor(positions: dict[str, str]) -> str:
    raw = json.dumps(positions, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(cursor: str, channels: list[str]) -> dict[str, str]:
    """Positions for `channels` from a cursor (400 if malformed); a channel it lacks starts at 0-0.

    Positions for channels that are not the reader's are ignored, so a cursor can't widen access.
    """
    try:
        if len(cursor) > MAX_CURSOR_LENGTH:
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        positions = json.loads(raw)
        if not isinstance(positions, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and STREAM_ID.match(v) for k, v in positions.items()
        ):
            raise ValueError
    except (ValueError, UnicodeDecodeError):
        raise bad_request("The cursor is malformed.") from None
    return {channel: positions.get(channel, "0-0") for channel in channels}
