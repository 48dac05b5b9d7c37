"""The worker's responses send their head with the first piece of their body in one write (gevent_worker.py,
HeadWithBody), and are otherwise gunicorn's: the same bytes, the same framing. On gunicorn's own request
parser and response, writing to a socket that records each write."""

from __future__ import annotations

import gunicorn.http.wsgi
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser

from gevent_worker import HeadWithBody


class RecordingSocket:
    def __init__(self):
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))


def respond(response_class, method: str, pieces: list[bytes], headers=()) -> list[bytes]:
    """The writes of a 200 response made of `pieces` to a `method` request, as `response_class` makes them."""
    cfg = Config()
    raw = f"{method} /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    request = next(iter(RequestParser(cfg, iter([raw]), ("127.0.0.1", 50000))))
    sock = RecordingSocket()
    response, _environ = gunicorn.http.wsgi.create(
        request, sock, ("127.0.0.1", 50000), ("127.0.0.1", 8000), cfg, response_class=response_class
    )
    response.start_response("200 OK", [("Content-Type", "text/plain"), *headers])
    for piece in pieces:
        response.write(piece)
    response.close()
    return sock.writes


def without_date(data: bytes) -> bytes:
    return b"\r\n".join(line for line in data.split(b"\r\n") if not line.startswith(b"Date: "))


def test_the_head_goes_with_the_first_chunk_and_the_rest_as_gunicorn_writes_it():
    ours = respond(HeadWithBody, "GET", [b"hello", b"world"])
    theirs = respond(gunicorn.http.wsgi.Response, "GET", [b"hello", b"world"])

    assert len(theirs) == 4  # head, two chunks, the last chunk
    assert len(ours) == 3
    assert ours[0].startswith(b"HTTP/1.1 200 OK\r\n") and ours[0].endswith(b"\r\n\r\n5\r\nhello\r\n")
    assert without_date(ours[0]) == without_date(theirs[0] + theirs[1])
    assert ours[1:] == theirs[2:] == [b"5\r\nworld\r\n", b"0\r\n\r\n"]


def test_a_response_of_known_length_is_one_write():
    ours = respond(HeadWithBody, "GET", [b"hello"], [("Content-Length", "5")])
    theirs = respond(gunicorn.http.wsgi.Response, "GET", [b"hello"], [("Content-Length", "5")])

    assert len(theirs) == 2 and len(ours) == 1
    assert without_date(ours[0]) == without_date(b"".join(theirs)) and ours[0].endswith(b"\r\n\r\nhello")


def test_a_head_request_gets_its_head_alone_and_an_empty_body_its_head_at_the_close():
    head = respond(HeadWithBody, "HEAD", [b"hello"], [("Content-Length", "5")])
    assert len(head) == 1 and head[0].endswith(b"\r\n\r\n") and b"hello" not in head[0]

    empty = respond(HeadWithBody, "GET", [], [("Content-Length", "0")])
    assert len(empty) == 1 and empty[0].startswith(b"HTTP/1.1 200 OK\r\n") and empty[0].endswith(b"\r\n\r\n")
