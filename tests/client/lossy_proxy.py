"""A loopback relay in front of the live service, for the client's tests of renewals whose answer is lost.

Every request is forwarded to the service and its answer relayed, but for `POST /auth/refresh` while `lose`
names a way to lose it: the request still reaches the service (which rotates the refresh token), and the client
gets a proxy's 502, nothing at all, a reset connection, silence until it gives up, or a page that is not JSON.
`stop()` closes the listening socket, so a connection is refused until `start()` listens on the same port.
"""

from __future__ import annotations

import json
import socket
import socketserver
import struct
import threading
from typing import Literal

import httpx

from tests.servers import free_cluster_port

Loss = Literal["bad_gateway", "no_answer", "reset", "silence", "not_json"]
RELAYED_HEADERS = ("Content-Type", "Retry-After", "X-Request-ID")


class _Listener(socketserver.ThreadingTCPServer):
    allow_reuse_address = True  # listen again on the port just closed
    daemon_threads = True


class LossyProxy:
    """One answer per connection (`Connection: close`), so each request opens a connection of its own."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.lose: Loss | None = None
        self.refresh_tokens: list[str] = []  # every refresh token presented to POST /auth/refresh, in order
        self.port = 0
        self._server: _Listener | None = None
        self._http = httpx.Client(base_url=upstream, timeout=30)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again on the same port, once it had one) and serve on a thread of its own."""
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        # Outside the ephemeral range: no outgoing connection takes the port while the relay is stopped.
        server = _Listener(("127.0.0.1", self.port or free_cluster_port()), Handler)
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop listening: from now on a connection to the port is refused."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def close(self) -> None:
        self.stop()
        self._http.close()

    def _serve(self, connection: socket.socket) -> None:
        method, path, headers, body = _read_request(connection)
        is_refresh = (method, path) == ("POST", "/auth/refresh")
        if is_refresh:
            self.refresh_tokens.append(json.loads(body).get("refresh_token", ""))
        forwarded = {name: value for name, value in headers.items() if name.lower() not in ("host", "connection")}
        answer = self._http.request(method, path, headers=forwarded, content=body)
        loss = self.lose if is_refresh else None
        if loss == "bad_gateway":
            _write(connection, 502, "Bad Gateway", {"Content-Type": "text/html"}, b"<h1>502 Bad Gateway</h1>")
        elif loss == "not_json":
            _write(connection, 200, "OK", {"Content-Type": "text/html"}, b"<h1>Welcome to the portal</h1>")
        elif loss == "reset":
            # Closing with a zero linger time sends a reset instead of the orderly end of the connection.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()
        elif loss == "silence":
            connection.settimeout(60)
            while connection.recv(1024):  # until the client gives up waiting and closes its end
                pass
        elif loss is None:
            relayed = {name: answer.headers[name] for name in RELAYED_HEADERS if name in answer.headers}
            _write(connection, answer.status_code, answer.reason_phrase, relayed, answer.content)
        # "no_answer": the connection is closed with nothing written


def _read_request(connection: socket.socket) -> tuple[str, str, dict[str, str], bytes]:
    """The request line's method and path, the headers and the body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = connection.recv(65536)
        if not chunk:
            raise ConnectionError("the client closed the connection before a whole request")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    request_line, *lines = head.decode("latin-1").split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    headers = dict(line.split(": ", 1) for line in lines)
    length = int(next((value for name, value in headers.items() if name.lower() == "content-length"), "0"))
    while len(body) < length:
        body += connection.recv(65536)
    return method, path, headers, body


def _write(connection: socket.socket, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{name}: {value}" for name, value in headers.items())]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
