"""The outlet (app/events/outlet.py): the hub writes a parked reader's events to its socket itself, and
wakes the reader's greenlet only when the socket would block, the client left, or the reader is needed.

Over a real socket pair, with gevent's own sockets and greenlets, and the hub's Subscription; the reader's
position is a small stand-in for the Follower (whose own rules test_guarantees.py proves end to end).
"""

from __future__ import annotations

import json
import time

import gevent
import gevent.lock
import gevent.socket
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, TextMessage

from app.events.bus import Event, channels_for
from app.events.cursor import CompactCursorWriter, CursorWriter, decode_cursor, encode_cursor, packed_position
from app.events.follow import StreamEnded
from app.events.hub import FAN_OUT_SLICE, RESYNC, Hub, Subscription
from app.events.outlet import FellBehind, Outlet, plain_socket, send_within
from app.events.sse import message_bytes, sse_outlet
from app.events.ws import text_frame
from tests.fuzzing import bounded


class Positions:
    """What the outlet needs of a Follower: move past an event once, in order, giving the cursor after it."""

    def __init__(self):
        self.last = 0

    def advance(self, event: Event) -> str | None:
        number = int(event.id.split("-")[0])
        if number <= self.last:
            return None
        self.last = number
        return f"c{number}"


class Count:
    def __init__(self):
        self.value = 0

    def inc(self, by: int = 1) -> None:
        self.value += by


def event(n: int, size: int = 10) -> Event:
    return Event(f"{n}-0", "broadcast", "tick", '"' + "x" * size + '"', "t")


def frame(event: Event, cursor: str) -> bytes:
    return f"[{cursor}]".encode() + event.data.encode()


@pytest.fixture
def pair():
    server, client = gevent.socket.socketpair()
    yield server, client
    server.close()
    client.close()


def outlet_on(server, send_timeout: float = 2.0, busy=None) -> tuple[Outlet, Count]:
    delivered = Count()

    def finish_rest(rest: bytes) -> None:
        send_within(server, rest, time.monotonic() + send_timeout)

    return Outlet(Positions(), server, frame, delivered, finish_rest, busy), delivered


def read_exactly(client, count: int) -> bytes:
    data = b""
    with gevent.Timeout(5):
        while len(data) < count:
            data += client.recv(count - len(data))
    return data


def parked(subscription: Subscription, outlet: Outlet) -> gevent.Greenlet:
    reader = gevent.spawn(subscription.take, 30, outlet)
    gevent.sleep(0)  # let it park (start waiting)
    assert subscription.outlet is outlet
    return reader


def test_events_to_a_parked_reader_are_written_without_waking_it(pair):
    server, client = pair
    subscription = Subscription(["broadcast"], "u", "s", maxsize=10)
    outlet, delivered = outlet_on(server)
    reader = parked(subscription, outlet)
    for n in (1, 2, 3, 2):  # the repeated 2 (history and live overlapping) is not written twice
        subscription.offer(event(n))
    expected = b"".join(frame(event(n), f"c{n}") for n in (1, 2, 3))
    assert read_exactly(client, len(expected)) == expected
    assert not reader.ready() and delivered.value == 3  # still parked: nothing woke it
    subscription.end("shutdown")  # and it does wake for what needs it
    assert reader.get(timeout=5) == [] and subscription.ended == "shutdown"


def test_a_resync_or_a_busy_socket_queues_and_wakes_the_reader(pair):
    server, _ = pair
    for item, busy in ((RESYNC, None), (event(1), lambda: True)):
        subscription = Subscription(["broadcast"], "u", "s", maxsize=10)
        outlet, delivered = outlet_on(server, busy=busy)
        reader = parked(subscription, outlet)
        subscription.offer(item)
        assert reader.get(timeout=5) == [item] and delivered.value == 0


def test_a_socket_that_would_block_hands_the_rest_to_the_reader_then_queues_in_order(pair):
    server, client = pair
    subscription = Subscription(["broadcast"], "u", "s", maxsize=10)
    outlet, _ = outlet_on(server)
    reader = parked(subscription, outlet)
    big = event(1, size=4 * 2**20)  # more than the socket buffers take at once
    subscription.offer(big)
    assert outlet.unsent and reader.get(timeout=5) == []  # woken: the rest is the reader's to write
    subscription.offer(event(2))  # while the reader is busy: queued, behind the rest
    assert list(subscription.items) == [event(2)]
    finishing = gevent.spawn(outlet.finish)
    expected = frame(big, "c1")
    assert read_exactly(client, len(expected)) == expected
    finishing.get(timeout=5)
    assert not outlet.unsent


def test_a_reader_that_cannot_take_the_rest_in_time_has_fallen_behind(pair):
    server, _ = pair
    subscription = Subscription(["broadcast"], "u", "s", maxsize=10)
    outlet, _ = outlet_on(server, send_timeout=0.2)
    parked(subscription, outlet)
    subscription.offer(event(1, size=4 * 2**20))  # and the client reads nothing
    with pytest.raises(StreamEnded) as ended:
        outlet.finish()
    assert ended.value.reason == "overflow"


def test_a_client_gone_wakes_the_reader_to_end(pair):
    server, client = pair
    subscription = Subscription(["broadcast"], "u", "s", maxsize=10)
    outlet, delivered = outlet_on(server)
    reader = parked(subscription, outlet)
    subscription.offer(event(1))
    assert read_exactly(client, 3)  # delivered while the client was there
    client.close()
    subscription.offer(event(2))  # its send fails: the reader is woken
    subscription.offer(event(3))  # and this one is queued for it
    assert reader.get(timeout=5) == [event(3)] and delivered.value == 1
    with pytest.raises(StreamEnded) as ended:
        outlet.finish()
    assert ended.value.reason == "gone"


def test_send_within_raises_with_the_unsent_rest(pair):
    server, _ = pair
    data = b"y" * (4 * 2**20)
    with pytest.raises(FellBehind) as behind:
        send_within(server, data, time.monotonic() + 0.2)
    rest = behind.value.args[0]
    assert 0 < len(rest) < len(data) and data.endswith(rest)


def test_only_plain_gevent_sockets_get_an_outlet(pair):
    server, _ = pair
    assert plain_socket(server) is server
    assert plain_socket(None) is None
    assert plain_socket(object()) is None


stream_ids = st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)).map(lambda p: f"{p[0]}-{p[1]}")


@bounded
@given(
    user=st.from_regex(r"[A-Za-z0-9_.:-]{1,40}", fullmatch=True),
    admin=st.booleans(),
    ids=st.lists(stream_ids, min_size=3, max_size=3),
)
def test_a_readers_cursor_writer_makes_the_same_cursor_as_encode_cursor(user, admin, ids):
    channels = channels_for(user, admin)
    positions = dict(zip(channels, ids, strict=False))
    cursor = CursorWriter(channels)(positions)
    assert cursor == encode_cursor(positions)
    assert decode_cursor(cursor, channels) == positions


ROOM_READER = ["user:u1", "broadcast", "lounge:a", "lounge:b"]


@bounded
@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.sampled_from(ROOM_READER), st.lists(stream_ids, min_size=4, max_size=4)),
        min_size=1,
        max_size=12,
    )
)
def test_a_compact_cursor_writer_moved_by_live_events_writes_what_a_fresh_one_does(steps):
    """A live event moves one channel (its id packed once, for all its readers); between them the writer also
    writes other positions (where a connection started). Each cursor is a fresh writer's for the same positions."""
    writer, positions = CompactCursorWriter(ROOM_READER), dict.fromkeys(ROOM_READER, "0-0")
    for live, channel, ids in steps:
        written = positions
        if live:
            positions[channel] = ids[0]
            cursor = writer.moved(positions, channel, ids[0], packed_position(ids[0]))
        else:
            written = dict(zip(ROOM_READER, ids, strict=True))
            cursor = writer(written)
        assert cursor == CompactCursorWriter(ROOM_READER)(written)
        assert decode_cursor(cursor, ROOM_READER) == written


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("size", [0, 1, 200, 5000])
def test_an_sse_frame_is_the_message_in_the_responses_framing(pair, chunked, size):
    server, _ = pair
    message_event, cursor = event(7, size), encode_cursor({"broadcast": "7-0", "user:u": "1-0"})
    framed = sse_outlet(Positions(), server, chunked, 1.0).frame(message_event, cursor)
    message = message_bytes(message_event, cursor)
    assert message == f"id: {cursor}\nevent: tick\ndata: {message_event.as_json()}\n\n".encode()
    assert framed == (b"%x\r\n%b\r\n" % (len(message), message) if chunked else message)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_a_text_frame_is_what_wsproto_makes_without_compression(size):
    server = WSConnection(ConnectionType.SERVER)
    server.initiate_upgrade_connection(
        [
            (b"sec-websocket-key", b"dGhlIHNhbXBsZSBub25jZQ=="),
            (b"sec-websocket-version", b"13"),
            (b"upgrade", b"websocket"),
            (b"connection", b"Upgrade"),
            (b"host", b"localhost"),
        ],
        "/ws",
    )
    server.send(AcceptConnection())
    payload = "é" * (size // 2) + "x" * (size % 2)
    assert text_frame(payload.encode()) == server.send(TextMessage(data=payload))


@bounded
@given(
    event_name=st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True),
    data=st.text(max_size=50),
    cursor=st.text(alphabet="ABCDEFabcdef0123456789-_", max_size=40),
)
def test_an_events_message_parts_around_a_cursor_are_its_websocket_message(event_name, data, cursor):
    event = Event("7-1", "broadcast", event_name, json.dumps(data), "2026-11-23T18:00:00.000Z")
    head, tail = event.message_parts()
    assert (head + cursor.encode() + tail).decode() == event.as_json(cursor, type="event")


class CountingSends:
    """The OS socket under an outlet, counting its writes."""

    def __init__(self, raw):
        self.raw, self.sends = raw, 0

    def send(self, data) -> int:
        self.sends += 1
        return self.raw.send(data)


def test_events_that_arrived_together_reach_a_parked_reader_in_one_write(pair):
    server, client = pair
    hub = Hub(topology=None)
    subscription = Subscription(["broadcast"], "u", "s", maxsize=10)
    hub.by_channel["broadcast"].add(subscription)
    hub.by_user["u"].add(subscription)
    outlet, delivered = outlet_on(server)
    outlet.raw = CountingSends(outlet.raw)
    reader = parked(subscription, outlet)
    wire = [
        (
            "wake:{broadcast}",
            json.dumps({"id": f"{n}-0", "channel": "broadcast", "event": "tick", "data": "1", "ts": "t"}),
        )
        for n in (1, 2, 3)
    ]
    hub.deliver_all(wire)
    expected = b"".join(frame(Event(f"{n}-0", "broadcast", "tick", "1", "t"), f"c{n}") for n in (1, 2, 3))
    assert read_exactly(client, len(expected)) == expected
    assert outlet.raw.sends == 1 and delivered.value == 3 and not reader.ready()
    hub.deliver_all(wire[:1] + [("control", json.dumps({"whole_user": True, "user_id": "u"}))] + wire[1:])
    reader.get(timeout=5)  # woken by the control message, which came after event 1 and before 2 and 3
    assert subscription.ended == "session_ended" and delivered.value == 3


class Recorder:
    """An outlet that notes the order of its writes among everything else that runs."""

    stalled = False

    def __init__(self, log: list):
        self.log = log

    def write(self, event) -> bool:
        return self.write_all([event])

    def write_all(self, events) -> bool:
        self.log.append("write")
        return True


@pytest.mark.parametrize("readers, events", [(FAN_OUT_SLICE * 3, 1), (3, FAN_OUT_SLICE)])
def test_a_large_fan_out_lets_other_greenlets_run_between_slices(readers, events):
    """Slices count deliveries: one event to many readers, or many events to a few."""
    hub = Hub(topology=None)
    log: list[str] = []
    for n in range(readers):
        subscription = Subscription(["broadcast"], f"u{n}", f"s{n}", maxsize=10)
        subscription.outlet = Recorder(log)
        hub.by_channel["broadcast"].add(subscription)
    gevent.spawn(log.append, "request")  # ready to run from now on
    wire = [
        ("wake:{broadcast}", json.dumps({"id": f"{n}-0", "channel": "broadcast", "event": "t", "data": "1", "ts": "t"}))
        for n in range(1, events + 1)
    ]
    hub.deliver_all(wire)
    assert log.count("write") == readers  # every reader was written to (a batch in one write)
    assert 0 < log.index("request") < readers  # and the other greenlet ran before the fan-out was over
