"""Cursors: an opaque string holding the last delivered stream id of each of the reader's channels."""

from __future__ import annotations

import base64
import binascii
import json
import re

from ..errors import bad_request
from ..http import StrictJSONError, parse_json

STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")  # ASCII only: \d also matches other scripts
MAX_CURSOR_LENGTH = 2048
MAX_ID_PART = 2**64 - 1  # Redis stream ids are two unsigned 64-bit numbers
LAST_POSSIBLE_ID = f"{MAX_ID_PART}-{MAX_ID_PART}"  # nothing can follow it (Redis refuses "(" + it)
URL_SAFE = bytes.maketrans(b"+/", b"-_")  # base64 to its URL-safe alphabet


def valid_stream_id(value) -> bool:
    """A Redis stream id (`<ms>-<seq>`) that Redis itself would accept."""
    return (
        isinstance(value, str)
        and STREAM_ID.fullmatch(value) is not None
        and all(int(part) <= MAX_ID_PART for part in value.split("-"))
    )


def parse_id(stream_id: str) -> tuple[int, int]:
    """A stream id as a pair of numbers, for ordering."""
    milliseconds, _, sequence = stream_id.partition("-")
    return int(milliseconds), int(sequence or 0)


def is_after(stream_id: str, position: str) -> bool:
    """Whether a stream id comes after a position."""
    return parse_id(stream_id) > parse_id(position)


def encode_cursor(positions: dict[str, str]) -> str:
    """The opaque cursor for a set of per-channel positions."""
    raw = json.dumps(positions, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class CursorWriter:
    """`encode_cursor` for one reader's channels, prepared once: a live reader's cursor is made again for
    every event it receives, so the JSON around the positions is a template and base64 is called bare."""

    __slots__ = ("channels", "template")

    def __init__(self, channels: list[str]):
        self.channels = sorted(set(channels))
        keys = [json.dumps(channel).replace("%", "%%") for channel in self.channels]
        self.template = "{" + ",".join(f'{key}:"%s"' for key in keys) + "}"

    def __call__(self, positions: dict[str, str]) -> str:
        """The cursor for `positions`: a stream id (which JSON needs no escape for) for each channel."""
        raw = (self.template % tuple(map(positions.__getitem__, self.channels))).encode()
        return binascii.b2a_base64(raw, newline=False).translate(URL_SAFE).rstrip(b"=").decode()


def decode_cursor(cursor: str, channels: list[str]) -> dict[str, str]:
    """Positions for `channels` from a cursor (400 if malformed); a channel it lacks starts at 0-0.

    Positions for channels that are not the reader's are ignored, so a cursor can't widen access.
    """
    positions = decode_positions(cursor)
    return {channel: positions.get(channel, "0-0") for channel in channels}


def decode_positions(cursor: str) -> dict[str, str]:
    """Every position a cursor holds, by channel (400 if malformed)."""
    try:
        if len(cursor) > MAX_CURSOR_LENGTH:
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        positions = parse_json(raw)
        if not isinstance(positions, dict) or not all(valid_stream_id(v) for v in positions.values()):
            raise ValueError
    except (ValueError, StrictJSONError):
        raise bad_request("The cursor is malformed.") from None
    return positions
