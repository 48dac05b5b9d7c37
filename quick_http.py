"""Requests the app answers at once, read by the worker itself rather than by gunicorn's parser.

gunicorn parses a request's head and builds its WSGI environ in Python: about 100 us of a worker's CPU for a
small POST, a seventh of a whole publication (bench/README.md), against 4 us with llhttp (httptools, uvicorn's
parser). A backend publishing one `POST /events` per event sends nothing else on its keep-alive connection.
So after each request gunicorn served on a connection that stays open, the worker reads the next one itself
(`QuickRequests.serve`): llhttp parses its head, and when it is one of the app's quick routes (`quick_routes`,
method and path), HTTP/1.1 with a body of known length and nothing unusual, the app is called with
`environ[QUICK_ONLY]`: it answers at once, or returns None. Whatever it does not answer that way, and whatever
this reading is unsure of (a duplicate header, `Expect`, `Transfer-Encoding`, a header gunicorn would drop or
refuse, a head or body beyond the limits, a stopping worker), goes back to gunicorn byte for byte, which parses
it from its start as if nothing had looked at it. The first request of a connection is always gunicorn's.

The answer is written as gunicorn writes it: status line, Server, Date, Connection, the app's headers, body.
"""

from __future__ import annotations

import io
import os
import time

import gevent
import gunicorn.config
import gunicorn.http.message
import gunicorn.util
import httptools
from gunicorn import SERVER
from gunicorn.http.message import (
    DEFAULT_MAX_HEADERFIELD_SIZE,
    MAX_HEADERS,
    RFC9110_5_5_INVALID_AND_DANGEROUS,
    TOKEN_RE,
)
from gunicorn.http.wsgi import HEADER_VALUE_RE, base_environ

QUICK_ONLY = "quick_http.only"  # environ key: answer at once, or return None and leave the request alone
HEAD_LIMIT = 8190  # gunicorn's own limits are this or above: a longer head is gunicorn's to serve or refuse
BODY_LIMIT = 65536
RECEIVE = 65536
KEEP_ALIVE = "keep-alive"
REFUSED_HEADERS = frozenset({"TRANSFER-ENCODING", "EXPECT", "UPGRADE", "TE", "TRAILER", "HTTP2-SETTINGS"})


class Head:
    """What llhttp reports of one request's head."""

    __slots__ = ("url", "headers")

    def __init__(self):
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))


class QuickRequests:
    """A worker's reading of the requests its app answers at once (see the module's text)."""

    def __init__(self, worker, routes):
        self.worker = worker
        # Their request lines, exactly: only heads that begin with one are parsed (and so have its route and version).
        self.starts = tuple(method + b" " + path + b" HTTP/1.1\r\n" for method, path in frozenset(routes))
        self.longest_start = max(len(start) for start in self.starts)
        cfg = self.cfg = worker.cfg
        self.base = base_environ(cfg) | {"wsgi.multithread": True, "SCRIPT_NAME": "", QUICK_ONLY: True}
        fields, field_size = cfg.limit_request_fields, cfg.limit_request_field_size  # as gunicorn reads them
        self.max_fields = fields if 0 < fields <= MAX_HEADERS else MAX_HEADERS
        self.max_line = field_size if field_size > 0 else DEFAULT_MAX_HEADERFIELD_SIZE

    @classmethod
    def for_worker(cls, worker) -> QuickRequests | None:
        """The worker's, if its app has quick routes and nothing in gunicorn's settings changes how a request is
        read or served: TCP listeners only (no Unix socket, whose peers have no address), no PROXY protocol,
        SCRIPT_NAME or TLS, gunicorn's own pre- and post-request hooks (which do nothing)."""
        routes = getattr(worker.wsgi, "quick_routes", None)
        cfg = worker.cfg
        plain = (
            cfg.proxy_protocol == "off"
            and not cfg.is_ssl
            and not os.environ.get("SCRIPT_NAME")
            and cfg.pre_request is gunicorn.config.PreRequest.default
            and cfg.post_request is gunicorn.config.PostRequest.default
            and all(isinstance(listener.getsockname(), tuple) for listener in worker.sockets)
        )
        return cls(worker, routes) if routes and plain else None

    def serve(self, req, sock, addr, server) -> None:
        """After gunicorn served `req` on `sock` (which stays open): answer the quick requests that follow, and
        give back to gunicorn's reader what was read of the first one that is not."""
        self._finish(req)
        buffer = req.unreader.take_buffered()
        try:
            while self.worker.alive:
                buffer, request = self._read(sock, addr, buffer)
                if request is None:
                    return
                environ, end = request
                environ.update(
                    {
                        "gunicorn.socket": sock,
                        "REMOTE_ADDR": addr[0],
                        "REMOTE_PORT": str(addr[1]),
                        "SERVER_NAME": server[0],
                        "SERVER_PORT": str(server[1]),
                    }
                )
                self.worker.idle_connections.discard(sock)
                closing = self.worker.nr + 1 >= self.worker.max_requests  # as gunicorn: its last, then it stops
                answer = self._answer(environ, closing)
                if answer is None:
                    return
                buffer = buffer[end:]
                sock.sendall(answer)
                self.worker.count_request()
                if closing:
                    raise StopIteration("the worker's last request")  # gunicorn's loop closes the connection
                self.worker.take_turn()
                self.worker.idle_connections.add(sock)
        finally:
            if buffer:
                req.unreader.unread(buffer)

    def _finish(self, req) -> None:
        """What gunicorn's reader does before the next request: stop where the last one closes the connection, and
        discard what is left of its body, within the keep-alive time; stop where that cannot be done (a body that
        failed to read, or did not arrive), because where the next request starts is then unknown."""
        body = req.body
        if req.should_close() or getattr(body, "failed", False):
            raise StopIteration("the last request ends the connection")
        if body is None:
            return
        with gevent.Timeout(self.cfg.keepalive, False):
            try:
                while body.read(8192):
                    pass
            except Exception:  # noqa: BLE001 - a malformed chunk: gunicorn's reader stops there too
                raise StopIteration("the last request's body cannot be read") from None
            return
        raise StopIteration("the last request's body did not arrive")

    def _read(self, sock, addr, buffer: bytes):
        """(all read so far, (the next request's environ, where it ends in that) or None for gunicorn's to
        read). The whole request must arrive within the keep-alive time, as gunicorn's wait has it; a connection
        that sent nothing by then ends."""
        deadline = time.monotonic() + self.cfg.keepalive
        while (head_end := buffer.find(b"\r\n\r\n")) < 0:
            if len(buffer) > HEAD_LIMIT or not self._may_be_quick(buffer):
                return buffer, None
            data = self._receive(sock, deadline)
            if data is None and not buffer:
                raise StopIteration("keep-alive time-out")  # gunicorn's keep-alive loop ends the connection
            if not data:
                return buffer, None
            buffer += data
        head = buffer[: head_end + 4]
        if len(head) > HEAD_LIMIT or not self._may_be_quick(buffer) or self._line_too_long(head):
            return buffer, None
        parsed = self._parse(head, addr)
        if parsed is None:
            return buffer, None
        environ, length = parsed
        end = head_end + 4 + length
        while len(buffer) < end:
            data = self._receive(sock, deadline)
            if not data:
                return buffer, None
            buffer += data
        environ["wsgi.input"] = io.BytesIO(buffer[head_end + 4 : end])
        return buffer, (environ, end)

    def _line_too_long(self, head: bytes) -> bool:
        """Whether a line of the head is over gunicorn's limit for a header line (the request line is a route's)."""
        return max(map(len, head.split(b"\r\n"))) + 2 > self.max_line

    def _may_be_quick(self, begun: bytes) -> bool:
        """Whether a request that begins with `begun` may be of a quick route: others are not parsed here."""
        begun = begun[: self.longest_start]
        return any(start.startswith(begun) for start in self.starts)

    def _receive(self, sock, deadline: float) -> bytes | None:
        """What `sock` has for us (b"" at its end), waiting at most until `deadline`: None if nothing came by then.
        A busy backend's next request is usually there already, and then no timer is made."""
        try:
            return sock._sock.recv(RECEIVE)  # the OS socket's, which does not wait (gevent's are non-blocking)
        except BlockingIOError:
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        with gevent.Timeout(remaining, False):
            return sock.recv(RECEIVE)
        return None

    def _parse(self, head: bytes, addr):
        """(the environ of the request whose head this is, its body's length), or None if it is not quick."""
        found = Head()
        parser = httptools.HttpRequestParser(found)
        try:
            parser.feed_data(head)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            return None
        if len(found.headers) > self.max_fields:
            return None
        environ = self.base.copy()
        seen: set[str] = set()
        length = None
        for raw_name, raw_value in found.headers:
            name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
            upper = name.upper()
            if (
                upper in seen
                or upper in REFUSED_HEADERS
                or "_" in name
                or not TOKEN_RE.fullmatch(name)
                or RFC9110_5_5_INVALID_AND_DANGEROUS.search(value)
            ):
                return None
            seen.add(upper)
            value = value.strip(" \t")
            if upper == "CONTENT-LENGTH":
                if not (value.isascii() and value.isdigit()):
                    return None
                length = int(value)
                environ["CONTENT_LENGTH"] = value
            elif upper == "CONTENT-TYPE":
                environ["CONTENT_TYPE"] = value
            else:
                if upper == "CONNECTION" and value.lower() != KEEP_ALIVE:
                    return None
                environ["HTTP_" + upper.replace("-", "_")] = value
        if length is None or length > BODY_LIMIT:
            return None
        scheme = self._scheme(environ, seen, addr)
        if scheme is None:
            return None
        path = found.url.decode("latin-1")
        environ.update(
            {
                "REQUEST_METHOD": parser.get_method().decode("latin-1"),
                "PATH_INFO": path,
                "RAW_URI": path,
                "QUERY_STRING": "",
                "SERVER_PROTOCOL": "HTTP/1.1",
                "wsgi.url_scheme": scheme,
            }
        )
        return environ, length

    def _scheme(self, environ, names: set[str], addr) -> str | None:
        """The scheme gunicorn gives the request: https where a trusted peer's secure-scheme header says so;
        None where two of them disagree (gunicorn refuses that)."""
        secure = self.cfg.secure_scheme_headers
        present = [name for name in names if name in secure]
        if not present or not self._trusted(addr):
            return "http"
        schemes = {"https" if environ["HTTP_" + name.replace("-", "_")] == secure[name] else "http" for name in present}
        return schemes.pop() if len(schemes) == 1 else None

    def _trusted(self, peer) -> bool:
        """Whether gunicorn lets this peer set forwarding and scheme headers (FORWARDED_ALLOW_IPS)."""
        cfg = self.cfg
        allowed = gunicorn.http.message._ip_in_allow_list  # the worker's remembered check
        return not isinstance(peer, tuple) or allowed(peer[0], cfg.forwarded_allow_ips, cfg.forwarded_allow_networks())

    def _answer(self, environ, closing: bool) -> bytes | None:
        """The app's answer, as gunicorn writes it (`closing`: the connection's last); None if the app leaves the
        request to gunicorn."""
        started: list = []

        def start_response(status, headers, exc_info=None):
            started[:] = [status, headers]
            return _no_write

        result = self.worker.wsgi(environ, start_response)
        if result is None:
            return None
        try:
            body = b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        status, headers = started
        lines = [f"HTTP/1.1 {status}\r\nServer: {SERVER}\r\nDate: {gunicorn.util.http_date()}\r\n"]
        lines.append("Connection: close\r\n" if closing else "Connection: keep-alive\r\n")
        has_length = False
        for name, value in headers:
            if not TOKEN_RE.fullmatch(name) or not HEADER_VALUE_RE.fullmatch(value):
                raise ValueError(f"invalid response header {name!r}")  # gunicorn refuses it too (name only)
            if name.lower() == "content-length":
                has_length = True
            elif gunicorn.util.is_hoppish(name):
                continue
            lines.append(f"{name}: {value.strip(STRIPPED)}\r\n")
        if not has_length:
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1") + body


STRIPPED = " \t"


def _no_write(_data):
    raise RuntimeError("a quick answer is returned, not written")
