"""The worker reads the requests its app answers at once itself (quick_http.py): a backend's publications after the
first request of its connection are parsed by llhttp and answered without gunicorn's parser, as gunicorn would
answer them; anything else goes back to gunicorn byte for byte."""

from __future__ import annotations

import json
import signal
import socket
import sys
import time

import gevent
import gevent.socket
import pytest
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser

from app.apikeys.store import create_key
from app.redis import Keys
from gevent_worker import SettledConfig
from quick_http import QUICK_ONLY, QuickRequests
from tests.servers import LiveServer

pytestmark = pytest.mark.not_on_cluster(reason="the worker's reading; the publication is tested on both")


def publication(key: str, channel: str = "broadcast", *extra: bytes, body: bytes | None = None) -> bytes:
    body = body if body is not None else json.dumps({"channel": channel, "event": "note"}).encode()
    head = [
        b"POST /events HTTP/1.1",
        b"Host: localhost",
        b"Authorization: Bearer " + key.encode(),
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(body),
        *extra,
    ]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


HEALTH = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


class Worker:
    """What QuickRequests needs of gunicorn's worker: the app, the settings, its turn and its counts."""

    def __init__(self, wsgi, **settings):
        cfg = Config()
        for name, value in settings.items():
            cfg.set(name, value)
        self.cfg, self.wsgi, self.alive, self.nr = SettledConfig(cfg), wsgi, True, 0
        self.max_requests = cfg.max_requests or sys.maxsize  # as gunicorn's worker has it
        self.idle_connections: set = set()
        self.sockets: list = []

    def count_request(self) -> None:
        self.nr += 1

    @staticmethod
    def take_turn() -> None:
        gevent.sleep(0)


class CountingApp:
    def __init__(self, wsgi):
        self.wsgi, self.quick, self.whole = wsgi, 0, 0

    def __call__(self, environ, start_response):
        if QUICK_ONLY in environ:
            self.quick += 1
        else:
            self.whole += 1
        return self.wsgi(environ, start_response)


@pytest.fixture
def key(app):
    with app.app_context():
        return create_key("publisher", ["events:publish"], ["*"])[0]


def opened(app, **settings):
    """(the worker, the app's counter, the server's socket, the client's, gunicorn's first request read from it)."""
    counting = CountingApp(app.wsgi_app)
    app.wsgi_app = counting
    worker = Worker(app, **settings)
    server, client = gevent.socket.socketpair()
    client.sendall(HEALTH)
    first = next(RequestParser(worker.cfg, server, ("127.0.0.1", 50000)))
    return worker, counting, server, client, first


@pytest.fixture
def connection(app):
    opened_here = opened(app)
    yield opened_here
    for sock in opened_here[2:4]:
        sock.close()


def serve(worker, server, first, client, then: bytes) -> list[bytes]:
    """QuickRequests.serve after `first`, with `then` sent: the answers the client got until serve returned."""
    client.sendall(then)
    QuickRequests(worker, [(b"POST", b"/events")]).serve(first, server, ("127.0.0.1", 50000), ("127.0.0.1", 8000))
    return [b"HTTP/1.1" + part for part in unread(client).split(b"HTTP/1.1")[1:]]


def unread(sock) -> bytes:
    """What `sock` holds now, without waiting."""
    held = b""
    sock.setblocking(False)
    try:
        while chunk := sock.recv(65536):
            held += chunk
    except BlockingIOError:
        pass
    sock.setblocking(True)
    return held


def test_publications_after_the_first_request_are_answered_by_the_worker_and_the_rest_given_back(connection, key, rdb):
    worker, counting, server, client, first = connection
    answers = serve(worker, server, first, client, publication(key, "room-a") + publication(key, "room-b") + HEALTH)
    assert [answer.split(b"\r\n")[0] for answer in answers] == [b"HTTP/1.1 201 CREATED"] * 2
    assert counting.quick == 2 and counting.whole == 0  # the health check not a quick route: not asked
    assert first.unreader.take_buffered() == HEALTH  # byte for byte, for gunicorn's next read
    assert worker.nr == 2
    assert [len(rdb.xrange(Keys.stream(room))) for room in ("room-a", "room-b")] == [1, 1]
    head, _, body = answers[0].partition(b"\r\n\r\n")
    assert json.loads(body)["channel"] == "room-a"
    assert b"\r\nConnection: keep-alive\r\n" in head and b"\r\nServer: gunicorn\r\n" in head
    assert f"\r\nContent-Length: {len(body)}\r\n".encode() in head


def with_length_header(request: bytes, *replacement: bytes) -> bytes:
    """`request` with its Content-Length header replaced by `replacement` (headers)."""
    head, _, body = request.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.startswith(b"Content-Length:")]
    return b"\r\n".join([*lines, *replacement]) + b"\r\n\r\n" + body


UNUSUAL = {
    "a GET": HEALTH,
    "a WebSocket's upgrade": b"GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    "a publication asking to upgrade": publication("KEY", "broadcast", b"Upgrade: h2c", b"Connection: Upgrade"),
    "a publication's path, longer": publication("KEY").replace(b"/events", b"/events/batch", 1),
    "two spaces in the request line": publication("KEY").replace(b"/events ", b"/events  ", 1),
    "a header line over gunicorn's limit": publication("KEY", "broadcast", b"X-Note: " + b"n" * 8190),
    "HTTP/1.0": publication("KEY").replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "a query": publication("KEY").replace(b"/events", b"/events?x=1", 1),
    "Connection: close": publication("KEY", "broadcast", b"Connection: close"),
    "Expect": publication("KEY", "broadcast", b"Expect: 100-continue"),
    "a repeated header": publication("KEY", "broadcast", b"X-Request-ID: a", b"X-Request-ID: b"),
    "a header with an underscore": publication("KEY", "broadcast", b"X_Forwarded_For: 10.0.0.1"),
    "chunked": with_length_header(publication("KEY"), b"Transfer-Encoding: chunked"),
    "two lengths": with_length_header(publication("KEY"), b"Content-Length: 41", b"Content-Length: 41"),
    "a bad length": with_length_header(publication("KEY"), b"Content-Length: +41"),
    "a body over the limit": publication("KEY", body=b"{" + b" " * 70_000 + b"}"),
    "an unknown key": publication("ak_unknown"),
    "a user's token": publication("KEY").replace(b"Bearer KEY", b"Bearer eyJ.x.y"),
}


@pytest.mark.parametrize("name", list(UNUSUAL))
def test_what_the_worker_does_not_answer_goes_back_to_gunicorn_byte_for_byte(connection, key, rdb, name):
    worker, counting, server, client, first = connection
    request = UNUSUAL[name].replace(b"KEY", key.encode())
    answers = serve(worker, server, first, client, publication(key, "room-ok") + request)
    assert len(answers) == 1 and answers[0].startswith(b"HTTP/1.1 201 ")  # one it answers, first
    assert first.unreader.take_buffered() + unread(server) == request
    assert counting.whole == 0 and worker.nr == 1
    assert rdb.xlen(Keys.stream("broadcast")) == 0


def test_a_connection_waiting_for_its_next_request_ends_after_the_keep_alive_time(app, key):
    worker, _counting, server, client, first = opened(app, keepalive=1)
    started = time.monotonic()
    with pytest.raises(StopIteration):  # gunicorn's keep-alive loop ends the connection on it
        serve(worker, server, first, client, publication(key, "room-a"))
    assert time.monotonic() - started >= 1
    assert worker.nr == 1  # the publication before the wait was answered
    begun = publication(key)[:20]  # a request begun but not finished by then: given back
    with gevent.Timeout(10):
        serve(worker, server, first, client, begun)
    assert first.unreader.take_buffered() == begun


@pytest.mark.parametrize(
    ("headers", "scheme"),
    [
        ([b"X-Forwarded-Proto: https"], "https"),
        ([b"X-Forwarded-Proto: http"], "http"),
        ([b"X-Forwarded-Proto: https", b"X-Forwarded-Ssl: off"], None),  # gunicorn refuses the contradiction
        ([], "http"),
    ],
)
def test_the_scheme_is_gunicorns_from_a_trusted_peer_only(app, headers, scheme):
    quick = QuickRequests(Worker(app, forwarded_allow_ips="127.0.0.1"), [(b"POST", b"/events")])
    head = publication("ak_x", "broadcast", *headers).partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
    trusted = quick._parse(head, ("127.0.0.1", 50000))
    untrusted = quick._parse(head, ("10.0.0.9", 50000))
    assert (trusted and trusted[0]["wsgi.url_scheme"]) == scheme
    assert untrusted[0]["wsgi.url_scheme"] == "http"


def test_a_publication_that_failed_is_given_back_and_answered_by_the_view_without_publishing_again(make_app, rdb):
    """A replicated publication that no replica confirms (one Redis, no replica): written once, then given back to
    gunicorn, whose reading of it the view answers with the error, publishing nothing more."""
    app = make_app(EVENT_DURABILITY="replicated")
    with app.app_context():
        key = create_key("publisher", ["events:publish"], ["*"])[0]
    worker, counting, server, client, first = opened(app)
    request = publication(key, "room-f")
    assert serve(worker, server, first, client, request) == []
    assert first.unreader.take_buffered() == request and rdb.xlen(Keys.stream("room-f")) == 1
    answer = app.test_client().post(
        "/events",
        data=request.partition(b"\r\n\r\n")[2],
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        environ_overrides={"gunicorn.socket": server},
    )
    assert answer.status_code == 503 and answer.get_json()["error"]["code"] == "unavailable"
    assert counting.whole == 1 and rdb.xlen(Keys.stream("room-f")) == 1
    again = app.test_client().post(  # the error was for that reading only
        "/events",
        data=request.partition(b"\r\n\r\n")[2],
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        environ_overrides={"gunicorn.socket": server},
    )
    assert again.status_code == 503 and rdb.xlen(Keys.stream("room-f")) == 2


def read_answer(sock: socket.socket) -> bytes:
    """One whole answer of known length from `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or pytest.fail(f"closed after {data!r}")
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")).split(b":")[1]
    )
    while len(body) < length:
        body += sock.recv(65536) or pytest.fail("closed in the body")
    assert len(body) == length  # nothing more was sent
    return head + b"\r\n\r\n" + body


def comparable(answer: bytes) -> bytes:
    """An answer without what differs between two publications: the date, the request id, the event's id."""
    head, _, body = answer.partition(b"\r\n\r\n")
    kept = [line for line in head.split(b"\r\n") if not line.startswith((b"Date: ", b"X-Request-ID: "))]
    return b"\r\n".join(kept) + b"\r\n\r\n" + body.replace(json.loads(body)["id"].encode(), b"ID")


def test_a_backends_connection_is_answered_alike_by_gunicorn_and_by_the_worker(live_server, key, rdb):
    """The first publication is gunicorn's to read, the next ones the worker's: the same bytes but the date, the
    request id and the event's id; a request in between is gunicorn's again, and the connection goes on."""
    with socket.create_connection(("127.0.0.1", live_server.port), timeout=30) as sock:
        answers = []
        for _ in range(3):
            sock.sendall(publication(key, "room-live"))
            answers.append(read_answer(sock))
        sock.sendall(HEALTH)
        assert read_answer(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(publication(key, "room-live"))
        answers.append(read_answer(sock))
    assert len({comparable(answer) for answer in answers}) == 1, answers
    assert answers[0].startswith(b"HTTP/1.1 201 CREATED\r\n")
    assert rdb.xlen(Keys.stream("room-live")) == 4


def test_a_stop_closes_a_backends_connection_waiting_for_its_next_publication_at_once(base_env, rdb, tmp_path, app):
    with app.app_context():
        key = create_key("publisher", ["events:publish"], ["*"])[0]
    server = LiveServer({**base_env, "GRACEFUL_TIMEOUT": "60"}, workers=1, log_path=tmp_path / "gunicorn.log")
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            for _ in range(2):  # the second read by the worker, which now waits for the third
                sock.sendall(publication(key, "room-stop"))
                assert read_answer(sock).startswith(b"HTTP/1.1 201 ")
            server.signal(signal.SIGTERM)
            server.process.wait(20)  # left open, the connection held the worker for its 60 s
            assert sock.recv(65536) == b""
        assert "Traceback" not in (tmp_path / "gunicorn.log").read_text()
    finally:
        server.stop()


def test_the_connections_last_request_is_answered_with_close_when_the_worker_reaches_max_requests(app, key):
    worker, _counting, server, client, first = opened(app, max_requests=2)
    worker.max_requests, worker.nr = 2, 1  # gunicorn's reading of the first was the worker's first
    with pytest.raises(StopIteration):  # gunicorn's keep-alive loop ends the connection on it
        serve(worker, server, first, client, publication(key, "room-last") + publication(key, "room-next"))
    answers = [b"HTTP/1.1" + part for part in unread(client).split(b"HTTP/1.1")[1:]]
    assert len(answers) == 1 and b"\r\nConnection: close\r\n" in answers[0] and worker.nr == 2
    assert first.unreader.take_buffered() == publication(key, "room-next")  # for gunicorn, which closes


@pytest.mark.parametrize(
    ("first_request", "why"),
    [
        (b"POST /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", "close"),
        (
            b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nHost: x\r\n\r\n",
            "failed",
        ),
        (b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n12345", "unfinished"),
    ],
)
def test_nothing_is_read_after_a_request_whose_end_ends_the_connection(app, key, first_request, why):
    """A request that closes the connection, whose body failed to read (a trailer gunicorn refuses), or whose
    body did not arrive within the keep-alive time: gunicorn's reader stops there, and so does the worker's, even
    with a publication behind it (the unfinished body's: none, it would be read as the body's rest)."""
    worker = Worker(app, keepalive=1)
    server, client = gevent.socket.socketpair()
    client.sendall(first_request)
    first = next(RequestParser(worker.cfg, server, ("127.0.0.1", 50000)))
    if why == "failed":
        with pytest.raises(Exception):  # noqa: B017, PT011 - the app meets gunicorn's refusal of the trailer
            first.body.read()
    behind = b"" if why == "unfinished" else publication(key, "room-smuggled")
    with pytest.raises(StopIteration), gevent.Timeout(10):
        serve(worker, server, first, client, behind)
    assert worker.nr == 0 and unread(client) == b""


def test_a_head_trickled_in_is_given_back_once_the_keep_alive_time_is_over(app, key):
    worker, _counting, server, client, first = opened(app, keepalive=1)
    request = publication(key, "room-slow")

    def trickle():
        for at in range(0, 40, 4):
            client.sendall(request[at : at + 4])
            gevent.sleep(0.3)

    trickling = gevent.spawn(trickle)
    started = time.monotonic()
    with gevent.Timeout(10):
        serve(worker, server, first, client, b"")
    assert 1 <= time.monotonic() - started < 2.5  # one keep-alive time for the whole head, not one per piece
    trickling.kill()
    assert request.startswith(first.unreader.take_buffered()) and worker.nr == 0


def test_only_plain_tcp_listeners_and_gunicorns_own_hooks_are_read_by_the_worker(app, tmp_path):
    tcp = gevent.socket.socket()
    tcp.bind(("127.0.0.1", 0))
    unix = gevent.socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "s"))
    worker = Worker(app)
    worker.sockets = [tcp]
    assert QuickRequests.for_worker(worker) is not None
    worker.sockets = [tcp, unix]
    assert QuickRequests.for_worker(worker) is None  # a Unix socket's peer has no address
    hooked = Worker(app, pre_request=lambda worker, req: None)
    hooked.sockets = [tcp]
    assert QuickRequests.for_worker(hooked) is None
    for sock in (tcp, unix):
        sock.close()
