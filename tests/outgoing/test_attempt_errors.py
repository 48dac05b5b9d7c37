"""An attempt's error reads as words: what went wrong, without a Python or OpenSSL wrapper around it."""

from __future__ import annotations

import socket
import threading

import pytest

from app.outgoing.sender import Sender
from app.settings import load_settings

SETTINGS = {
    "APP_ENV": "test",
    "SECRET_KEY": "s" * 40,
    "JWT_SECRET": "j" * 40,
    "WEBHOOK_OUT_ALLOW_PRIVATE": "true",  # the receivers below are on loopback
    "WEBHOOK_OUT_ALLOW_HTTP": "true",
    "WEBHOOK_OUT_TIMEOUT_SECONDS": "20",
}
pytestmark = pytest.mark.not_on_cluster("the sender alone: no Redis")


@pytest.fixture
def sender() -> Sender:
    return Sender(load_settings(SETTINGS).outgoing_webhooks, 2)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def listener():
    """A loopback listener that answers each connection with `reply` (bytes), then hangs up."""
    server = socket.create_server(("127.0.0.1", 0))
    replies: list[bytes] = []

    def serve():
        for reply in replies:
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                if reply:
                    connection.sendall(reply)

    def start(*reply: bytes) -> int:
        replies.extend(reply)
        threading.Thread(target=serve, daemon=True).start()
        return server.getsockname()[1]

    yield start
    server.close()


def test_a_refused_connection_reads_as_words(sender):
    result = sender.send("ep", f"http://127.0.0.1:{closed_port()}/hook", b"{}", {})
    assert result.error == "could not connect: connection refused"


def test_a_tls_failure_and_a_dropped_connection_read_as_words(sender, listener):
    port = listener(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", b"")
    tls = sender.send("ep-tls", f"https://127.0.0.1:{port}/hook", b"{}", {})  # a plain-HTTP answer to TLS
    dropped = sender.send("ep-drop", f"http://127.0.0.1:{port}/hook", b"{}", {})  # hung up without an answer
    for result, start in ((tls, "TLS failed: "), (dropped, "connection failed: ")):
        assert result.error is not None and result.error.startswith(start), result.error
        reason = result.error.removeprefix(start)
        assert reason[:1].islower() and not any(mark in reason for mark in "()[]'_:"), result.error
