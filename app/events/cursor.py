"""Cursors: an opaque string holding the last delivered stream id of each of the reader's channels.

Two forms. A reader of its own channels only (`user:<id>`, `broadcast`) gets base64 of a JSON object,
channel -> position. A reader of named channels (`<namespace>:<name>`, up to MAX_CHANNELS_PER_CONNECTION
of them) gets the compact form, so a cursor of 100 channels fits in a URL: a version byte, then per channel
a 6-byte hash of its name and its position as two varints. The reader's request names its channels, which
is how the hashes are read back.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re

from ..errors import bad_request
from ..http import StrictJSONError, parse_json

STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")  # ASCII only: \d also matches other scripts
MAX_CURSOR_LENGTH = 8192
COMPACT_VERSION = b"\x01"  # base64 "A...": a JSON cursor starts with "ey" (`{"`)
CHANNEL_HASH_BYTES = 6
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
        return _base64((self.template % tuple(map(positions.__getitem__, self.channels))).encode())

    def moved(self, positions: dict[str, str], _channel: str, _position: str, _packed: bytes) -> str:
        """The cursor for `positions` after a live event (as CompactCursorWriter.moved)."""
        return self(positions)


def channel_hash(channel: str) -> bytes:
    """The short hash that names a channel in a compact cursor."""
    return hashlib.blake2b(channel.encode(), digest_size=CHANNEL_HASH_BYTES).digest()


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _read_varint(raw: bytes, at: int) -> tuple[int, int]:
    number = shift = 0
    while True:
        if at >= len(raw) or shift > 70:
            raise ValueError("truncated")
        byte = raw[at]
        number |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return number, at


def packed_position(stream_id: str) -> bytes:
    """A stream id as the two varints of a compact cursor."""
    milliseconds, sequence = parse_id(stream_id)
    return _varint(milliseconds) + _varint(sequence)


class CompactCursorWriter:
    """The compact cursor of a reader of named channels. A live reader's cursor is made again for every
    event it receives, and only that event's channel has moved: the raw cursor's pieces are kept, and a live
    event replaces its channel's packed position (packed once per event, for all its readers)."""

    __slots__ = ("channels", "index", "pieces", "at")

    def __init__(self, channels: list[str]):
        self.channels = sorted(set(channels))
        self.index = {channel: 2 + 2 * n for n, channel in enumerate(self.channels)}  # its position's piece
        self.pieces = [COMPACT_VERSION]
        for channel in self.channels:
            self.pieces += (channel_hash(channel), b"")
        self.at: dict[str, str] = {}  # the position each channel's piece holds

    def __call__(self, positions: dict[str, str]) -> str:
        """The compact cursor for `positions` (a stream id for each channel)."""
        pieces, at = self.pieces, self.at
        for channel, index in self.index.items():
            position = positions[channel]
            if at.get(channel) != position:
                pieces[index], at[channel] = packed_position(position), position
        return _base64(b"".join(pieces))

    def moved(self, positions: dict[str, str], channel: str, position: str, packed: bytes) -> str:
        """The cursor for `positions` after a live event moved `channel` to `position` (packed as `packed`)."""
        self.pieces[self.index[channel]], self.at[channel] = packed, position
        return self(positions)


def _base64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(URL_SAFE).rstrip(b"=").decode()


def cursor_writer(channels: list[str], compact: bool):
    """The cursor writer for a reader's channels: compact when it reads named channels."""
    return CompactCursorWriter(channels) if compact else CursorWriter(channels)


class HashedPositions:
    """A compact cursor's positions, looked up by channel name (the cursor holds only hashes)."""

    __slots__ = ("by_hash",)

    def __init__(self, by_hash: dict[bytes, str]):
        self.by_hash = by_hash

    def get(self, channel: str, default: str | None = None) -> str | None:
        """The position of `channel`, or `default` when the cursor does not name it."""
        return self.by_hash.get(channel_hash(channel), default)

    def __contains__(self, channel: str) -> bool:
        return channel_hash(channel) in self.by_hash


def decode_cursor(cursor: str, channels: list[str]) -> dict[str, str]:
    """Positions for `channels` from a cursor (400 if malformed); a channel it lacks starts at 0-0.

    Positions for channels that are not the reader's are ignored, so a cursor can't widen access.
    """
    positions = decode_positions(cursor)
    return {channel: positions.get(channel, "0-0") for channel in channels}


def named_in(cursor: str, channels: list[str]) -> set[str]:
    """Which of `channels` a (well-formed) cursor names."""
    positions = decode_positions(cursor)
    return {channel for channel in channels if channel in positions}


def decode_positions(cursor: str) -> dict[str, str] | HashedPositions:
    """Every position a cursor holds, by channel (400 if malformed); look them up with `.get(channel)`."""
    try:
        if len(cursor) > MAX_CURSOR_LENGTH:
            raise ValueError
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        if raw[:1] == COMPACT_VERSION:
            return _compact_positions(raw)
        positions = parse_json(raw)
        if not isinstance(positions, dict) or not all(valid_stream_id(v) for v in positions.values()):
            raise ValueError
    except (ValueError, StrictJSONError):
        raise bad_request("The cursor is malformed.") from None
    return positions


def _compact_positions(raw: bytes) -> HashedPositions:
    by_hash, at = {}, 1
    while at < len(raw):
        hashed = raw[at : at + CHANNEL_HASH_BYTES]
        if len(hashed) < CHANNEL_HASH_BYTES:
            raise ValueError("truncated")
        milliseconds, at = _read_varint(raw, at + CHANNEL_HASH_BYTES)
        sequence, at = _read_varint(raw, at)
        if milliseconds > MAX_ID_PART or sequence > MAX_ID_PART:
            raise ValueError("not a stream id")
        by_hash[hashed] = f"{milliseconds}-{sequence}"
    return HashedPositions(by_hash)
