"""The `text/event-stream` parser: the standard's rules, fed bytes split at every possible place."""

from __future__ import annotations

import pytest
from auth_rt_client.sse import ServerSentEvent, SSEParser, parse_lines, split_lines


def parse(stream: bytes, chunk: int | None = None) -> tuple[list[ServerSentEvent], SSEParser]:
    parser = SSEParser()
    chunks = [stream[i : i + chunk] for i in range(0, len(stream), chunk)] if chunk else [stream]
    return list(parse_lines(split_lines(chunks), parser)), parser


SERVICE_STREAM = (
    b"retry: 2000\n: stream open\n\n"
    b'id: c1\nevent: order.paid\ndata: {"a":1}\n\n'
    b": ping\n\n"
    b'event: session_ended\ndata: {"reason":"token_expired"}\n\n'
)


@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 7])
def test_the_service_stream_in_any_chunking(chunk):
    messages, parser = parse(SERVICE_STREAM, chunk)
    assert messages == [
        ServerSentEvent("order.paid", '{"a":1}', "c1"),
        ServerSentEvent("session_ended", '{"reason":"token_expired"}', None),  # no id of its own
    ]
    assert parser.retry_ms == 2000


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("chunk", [None, 1])
def test_every_line_ending_the_standard_allows(ending, chunk):
    stream = ending.join([b"id: 7", b"data: a", b"data: b", b"", b""])
    assert parse(stream, chunk)[0] == [ServerSentEvent("message", "a\nb", "7")]


def test_only_cr_and_lf_end_lines_not_other_unicode_breaks():
    data = '{"text":"a\u2028b\u0085c\x0cd\x1ce"}'
    messages, _ = parse(b"data: " + data.encode() + b"\n\n", 1)
    assert messages == [ServerSentEvent("message", data, None)]


def test_field_rules():
    stream = (
        b"data:no space\ndata:  two spaces\nid\nunknown: x\nretry: 12a\n\n"  # `id` alone: an empty id
        b"event: e\n\n"  # no data: nothing dispatched, and the event name does not carry over
        b"data\n\n"  # a field without a colon has an empty value
        b"id: a\x00b\ndata: x\n\n"  # an id holding NUL is ignored
    )
    messages, parser = parse(stream)
    assert messages == [
        ServerSentEvent("message", "no space\n two spaces", ""),
        ServerSentEvent("message", "", None),
        ServerSentEvent("message", "x", None),
    ]
    assert parser.retry_ms is None


def test_a_message_cut_off_by_a_dropped_connection_is_not_dispatched():
    assert parse(b'id: c1\ndata: {"a":1}\n\nid: c2\ndata: {"b"')[0] == [ServerSentEvent("message", '{"a":1}', "c1")]
    assert parse(b"id: c1\ndata: x\n")[0] == []


def test_a_byte_order_mark_at_the_start_is_skipped():
    assert parse(b"\xef\xbb\xbfdata: x\n\n")[0] == [ServerSentEvent("message", "x", None)]
