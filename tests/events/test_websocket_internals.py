"""The parts of simple-websocket the service relies on beyond its public API (app/events/ws.py,
SocketControl): if an upgrade renames or drops one, this fails here rather than in production."""

from __future__ import annotations

import base64
import os
import socket

import pytest
import simple_websocket

from app.events.ws import SocketControl, parser_is_idle


def upgrade_request(socket_key: str, sock) -> dict:
    """The WSGI environ of a WebSocket handshake whose socket the server finds under `socket_key`."""
    return {
        socket_key: sock,
        "HTTP_HOST": "localhost",
        "HTTP_CONNECTION": "Upgrade",
        "HTTP_UPGRADE": "websocket",
        "HTTP_SEC_WEBSOCKET_KEY": base64.b64encode(os.urandom(16)).decode(),
        "HTTP_SEC_WEBSOCKET_VERSION": "13",
    }


def upgraded_server() -> tuple[simple_websocket.Server, socket.socket]:
    """A real simple-websocket server over a socket pair, past its handshake."""
    server_side, client_side = socket.socketpair()
    server = simple_websocket.Server(upgrade_request("werkzeug.socket", server_side))
    client_side.settimeout(5)
    assert client_side.recv(4096).startswith(b"HTTP/1.1 101")
    return server, client_side


def test_the_attributes_socket_control_uses_exist():
    server, client = upgraded_server()
    try:
        for name in SocketControl.ATTRIBUTES:
            assert hasattr(server, name), f"simple-websocket no longer has Server.{name}"
        for name in SocketControl.HANDSHAKE_ATTRIBUTES:  # what is let go of after the upgrade
            assert hasattr(server.ws.handshake, name), f"wsproto's handshake no longer has {name}"
        assert parser_is_idle(server.ws.connection._proto)  # wsproto's parser has what it is judged by
        queue = getattr(server.ws.connection, "_events", None)  # replaced by an empty tuple once upgraded
        assert queue is not None and not queue, "wsproto's connection no longer keeps its own event queue"
    finally:
        server.close()
        client.close()


def test_frames_go_out_through_our_writer_and_a_closed_connection_receives_nothing_more():
    server, client = upgraded_server()
    try:
        control = SocketControl(server, send_timeout=2)
        assert server.sock is control.writer and control.open
        control.writer.send(control.text_frame('{"type": "pong"}'))
        frame = client.recv(4096)
        assert frame[0] == 0x81 and frame.endswith(b'{"type": "pong"}')  # one whole, final text frame
        control.writer.send(control.close_frame(1008, "session ended"))
        closing = client.recv(4096)
        assert closing[0] == 0x88 and int.from_bytes(closing[2:4], "big") == 1008
        control.mark_closed()
        with pytest.raises(simple_websocket.ConnectionClosed):  # what the connection's loop then sees
            server.receive(timeout=0)
        assert not control.open
    finally:
        client.close()


def read_frame(client) -> tuple[int, bytes]:
    """One unmasked server frame (opcode, payload) from a blocking socket."""
    head = client.recv(2)
    length = head[1] & 0x7F
    payload = b""
    while len(payload) < length:
        payload += client.recv(length - len(payload))
    return head[0] & 0x0F, payload


def masked(opcode: int, payload: bytes) -> bytes:
    """One final client frame (clients mask theirs), payload under 126 bytes."""
    mask = os.urandom(4)
    return bytes((0x80 | opcode, 0x80 | len(payload))) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_over_a_plain_socket_the_connection_reads_and_pings_without_simple_websockets_reader():
    import gevent.event
    import gevent.socket

    from app.events.ws import NotStarted, reader_thread

    server_side, client = gevent.socket.socketpair()
    server = simple_websocket.Server(upgrade_request("gunicorn.socket", server_side), thread_class=reader_thread)
    try:
        assert isinstance(server.thread, NotStarted)
        assert client.recv(4096).startswith(b"HTTP/1.1 101")
        control = SocketControl(server, send_timeout=2)
        assert server.ws.connection._events == ()  # what follows works without wsproto's own queue
        woken = server.event = gevent.event.Event()
        control.watch_reads()
        client.sendall(masked(0x1, b'{"type": "ping"}') + masked(0x9, b"are you there"))
        assert woken.wait(5)  # the watcher noticed the client's frames
        control.take_in()
        assert server.receive(timeout=0) == '{"type": "ping"}'
        assert read_frame(client) == (0xA, b"are you there")  # simple-websocket answered the ping
        assert control.ping() and read_frame(client)[0] == 0x9  # our ping went out
        assert not control.ping()  # unanswered: the connection is to end
        client.sendall(masked(0xA, b""))
        control.take_in()
        assert control.ping()  # answered, so the next one goes out
        client.close()
        control.take_in()
        assert not control.open  # the client left
    finally:
        control.stop_reading()
        server_side.close()


def test_a_parked_connection_lets_an_idle_parser_go_and_keeps_one_holding_half_a_frame():
    import gevent.socket

    from app.events.ws import reader_thread

    server_side, client = gevent.socket.socketpair()
    server = simple_websocket.Server(upgrade_request("gunicorn.socket", server_side), thread_class=reader_thread)
    assert client.recv(4096).startswith(b"HTTP/1.1 101")
    control = SocketControl(server, send_timeout=2)
    try:
        control.let_parser_go()
        assert server.ws.connection._proto is None  # idle: let go
        control.take_parser_back()
        ping, message = masked(0x9, b"still there"), masked(0x1, b'{"type": "ping"}')
        client.sendall(ping + message[:5])  # a whole ping and the start of a message
        control.take_in()
        assert read_frame(client) == (0xA, b"still there")  # a fresh parser reads frames as the old one did
        control.let_parser_go()
        assert server.ws.connection._proto is not None  # half a frame is kept
        client.sendall(message[5:])
        control.take_in()
        assert server.receive(timeout=0) == '{"type": "ping"}'
        control.let_parser_go()
        assert server.ws.connection._proto is None
    finally:
        control.stop_reading()
        server_side.close()
        client.close()
