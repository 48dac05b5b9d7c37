"""The benchmark's load generator counts exactly: framing decoded wherever it splits an event, and each
stream's events checked by number (missing, delivered twice, out of each publisher's order)."""

from __future__ import annotations

import asyncio
import struct
from concurrent.futures import ThreadPoolExecutor

from bench.streams import Chunked, Deferred, WebSocketFrames, read_tags, tag, verdict


def chunked(body: bytes, size: int) -> bytes:
    """`body` in chunks of `size` bytes, as a server that flushes often would send it."""
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts) + b"0\r\n\r\n"


def fed_byte_by_byte(decoder, wire: bytes) -> bytes:
    return b"".join(decoder.feed(wire[i : i + 1]) for i in range(len(wire)))


BODY = "".join(f'data: {{"text": "{tag("run7", n)}"}}\n\n' for n in range(40)).encode()


def test_chunk_headers_inside_tags_are_decoded_away():
    wire = chunked(BODY, 7)  # a chunk header inside nearly every tag
    assert BODY.count(b"run7:") == 40 and wire.count(b"run7:") < 40  # raw counting would miss events
    assert fed_byte_by_byte(Chunked(), wire) == BODY
    assert Chunked().feed(wire) == BODY


def test_a_server_that_answers_with_its_first_event_is_decoded_after_its_head():
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    assert fed_byte_by_byte(Deferred(), head + chunked(BODY, 5)) == BODY


def test_websocket_frames_of_every_length_encoding():
    messages = [b"a" * 10, b"b" * 300, b"c" * 70000]
    wire = b""
    for message in messages:
        if len(message) < 126:
            wire += bytes([0x81, len(message)]) + message
        elif len(message) < 65536:
            wire += bytes([0x81, 126]) + struct.pack("!H", len(message)) + message
        else:
            wire += bytes([0x81, 127]) + struct.pack("!Q", len(message)) + message
    wire += bytes([0x89, 0])  # a ping: not a message
    assert WebSocketFrames().feed(wire) == b"\n".join(messages) + b"\n"


def test_read_tags_finds_each_number_once_however_the_bytes_arrive():
    class Pieces:
        def __init__(self, data: bytes, size: int):
            self.pieces = [data[i : i + size] for i in range(0, len(data), size)]

        async def read(self) -> bytes:
            return self.pieces.pop(0) if self.pieces else b""

    for size in (1, 3, 11, 64):
        seen, arrivals = [], []
        with ThreadPoolExecutor(1) as thread:  # its own thread: the browser tests' Playwright keeps a loop running
            thread.submit(asyncio.run, read_tags(Pieces(BODY, size), b"run7", 40, arrivals, seen)).result()
        assert seen == list(range(40)) and len(arrivals) == 40


def test_verdict_names_what_went_wrong():
    assert verdict([0, 1, 2, 3], 4, publishers=2) == {"missing": 0, "duplicates": 0, "out_of_order": 0}
    assert verdict([1, 0, 3, 2], 4, publishers=2) == {"missing": 0, "duplicates": 0, "out_of_order": 0}
    assert verdict([2, 0, 1, 3], 4, publishers=2) == {"missing": 0, "duplicates": 0, "out_of_order": 1}
    assert verdict([0, 1, 1, 3], 4, publishers=2) == {"missing": 1, "duplicates": 1, "out_of_order": 0}
