"""Real clients for the delivery tests: HTTP API calls, an SSE reader on a raw connection, WebSocket."""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import socket
import threading
import time
import zlib
from urllib.parse import urlencode, urlparse

import requests
import websocket

from bench.streams import Chunked, Plain
from tests.utils import DEFAULT_PASSWORD, random_email


class Api:
    """One logged-in user (body transport) against a live server."""

    def __init__(self, base: str, email: str | None = None, device: str = "test"):
        self.base = base
        self.http = requests.Session()
        self.email = email or random_email()
        if email is None:
            response = self.http.post(f"{base}/auth/register", json={"email": self.email, "password": DEFAULT_PASSWORD})
            assert response.status_code == 201, response.text
        self.login(device)

    def login(self, device: str = "test") -> None:
        body = {"email": self.email, "password": DEFAULT_PASSWORD, "transport": "body", "device": device}
        response = self.http.post(f"{self.base}/auth/login", json=body)
        assert response.status_code == 200, response.text
        tokens = response.json()
        self.access_token, self.refresh_token = tokens["access_token"], tokens["refresh_token"]
        self.session_id, self.user_id = tokens["session_id"], tokens["user"]["id"]

    @property
    def channel(self) -> str:
        return f"user:{self.user_id}"

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.access_token}"}

    def publish(self, data, event: str = "test", channel: str | None = None) -> requests.Response:
        body = {"channel": channel or self.channel, "event": event, "data": data}
        return self.http.post(f"{self.base}/events", json=body, headers=self.auth)

    def publish_ok(self, data, event: str = "test", channel: str | None = None) -> str:
        response = self.publish(data, event, channel)
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def poll(self, cursor: str | None = None, **params) -> requests.Response:
        if cursor:
            params["cursor"] = cursor
        return self.http.get(f"{self.base}/events", params=params, headers=self.auth)

    def wait(self, cursor: str | None = None, **params) -> requests.Response:
        if cursor:
            params["cursor"] = cursor
        return self.http.get(f"{self.base}/events/wait", params=params, headers=self.auth, timeout=30)

    def current_cursor(self) -> str:
        return self.poll().headers["Event-Cursor"]

    def logout_all(self) -> None:
        assert self.http.post(f"{self.base}/auth/logout-all", headers=self.auth).status_code == 204


def open_connections(base: str, transport: str) -> int:
    """How many connections of a transport the server holds right now (its own gauge, summed over workers)."""
    for line in requests.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith(f'rt_open_connections{{transport="{transport}"}}'):
            return int(float(line.split()[-1]))
    return 0


class SSE:
    """Reads an SSE response on its own thread; frames are parsed exactly as the wire carries them."""

    def __init__(
        self,
        base: str,
        headers: dict,
        cursor: str | None = None,
        path: str = "/events/stream",
        timeout: float = 30,
        params: dict | None = None,
    ):
        url = urlparse(base)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
        params = {**(params or {}), **({"cursor": cursor} if cursor else {})}
        query = f"?{urlencode(params)}" if params else ""
        self.conn.request(
            "GET", path + query, headers={"Accept": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = self.response.headers
        self.raw = ""
        self.frames: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = self.response.read()

    def _read(self) -> None:
        buffer = ""
        # A proxy may compress the stream when the client offers gzip (as browsers do): decode it.
        gzipped = self.headers.get("Content-Encoding") == "gzip"
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        try:
            while True:
                chunk = self.response.read1(65536)
                if not chunk:
                    break
                text = (inflate.decompress(chunk) if inflate else chunk).decode()
                self.raw += text
                buffer += text
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    self.frames.put((time.monotonic(), parse_block(block)))
        except Exception:  # noqa: BLE001, S110 - closing the connection under the reader ends it any way
            pass
        finally:
            self.closed.set()

    def next(self, timeout: float = 5.0, skip_comments: bool = True) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no SSE frame arrived")
            try:
                _, frame = self.frames.get(timeout=remaining)
            except queue.Empty:
                raise TimeoutError("no SSE frame arrived") from None
            if skip_comments and ("comment" in frame and len(frame) == 1 or "retry" in frame and "data" not in frame):
                continue
            return frame

    def next_event(self, timeout: float = 5.0) -> dict:
        """The next frame that carries data, with `data` decoded from JSON."""
        frame = self.next(timeout)
        return {**frame, "data": json.loads(frame["data"])}

    def events(self, count: int, timeout: float = 10.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        return [self.next_event(max(0.01, deadline - time.monotonic())) for _ in range(count)]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.sock and self.conn.sock.shutdown(2)
        self.conn.close()


class RawSSE:
    """One SSE request on a plain socket; the body is decoded from the transfer framing as it arrives."""

    def __init__(self, base: str, headers: dict, version: str = "HTTP/1.1", receive_buffer: int | None = None):
        url = urlparse(base)
        self.sock = socket.socket()
        if receive_buffer:  # before connecting, so the window the server sees is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(10)
        self.sock.connect((url.hostname, url.port))
        lines = [f"GET /events/stream {version}", f"Host: {url.netloc}", "Accept: text/event-stream"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        self.status_line, *header_lines = head.decode().split("\r\n")
        self.headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines if line)}
        self.chunked = self.headers.get("transfer-encoding") == "chunked"
        self.decoder = Chunked() if self.chunked else Plain()
        self.text = ""
        self.eof = False
        self.counted_to = 0  # where in `text` the messages counted so far end
        self.counted = 0  # complete messages with data before that: what events() would find
        while ": stream open" not in self.text:  # then the stream parks: nothing is pending
            assert self.read(10), "the stream closed before it opened"

    def read(self, timeout: float) -> bool:
        """Read what comes within `timeout`; False at the end of the connection."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(65536)
        if not data:
            self.eof = True
            return False
        self.text += self.decoder.feed(data).decode()
        return True

    def events(self) -> list[dict]:
        """The complete messages with data so far, data decoded."""
        found = []
        for block in self.text.split("\n\n")[:-1]:
            fields = dict(line.split(": ", 1) for line in block.split("\n") if line and not line.startswith(":"))
            if "data" in fields:
                found.append({**fields, "data": json.loads(fields["data"])})
        return found

    def count_events(self) -> int:
        """len(self.events()), counted over the text new since the last call: a megabyte stream is not
        split and JSON-parsed again after every read."""
        while (end := self.text.find("\n\n", self.counted_to)) != -1:
            block = self.text[self.counted_to : end]
            self.counted += any(line.startswith("data: ") for line in block.split("\n"))
            self.counted_to = end + 2
        return self.counted

    def read_events(self, count: int, timeout: float = 10) -> list[dict]:
        deadline = time.monotonic() + timeout
        while self.count_events() < count:
            if not self.read(max(0.01, deadline - time.monotonic())):
                break
        return self.events()

    def read_to_end(self, timeout: float = 10) -> None:
        """Read until the response ends (its last chunk) or the connection does."""
        deadline = time.monotonic() + timeout
        while not (self.chunked and self.decoder.ended) and self.read(max(0.01, deadline - time.monotonic())):
            pass

    def close(self) -> None:
        self.sock.close()


def parse_block(block: str) -> dict:
    """One SSE message block: fields by name (data lines joined by \\n), comments under 'comment'."""
    frame: dict = {}
    for line in block.split("\n"):
        if line.startswith(":"):
            frame.setdefault("comment", []).append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        frame[name] = f"{frame[name]}\n{value}" if name == "data" and name in frame else value
    return frame


def ws_url(base: str, cursor: str | None = None, params: dict | None = None) -> str:
    params = {**(params or {}), **({"cursor": cursor} if cursor else {})}
    query = f"?{urlencode(params)}" if params else ""
    return base.replace("http://", "ws://") + "/ws" + query


def open_ws(
    base: str, headers: dict, cursor: str | None = None, params: dict | None = None, **options
) -> websocket.WebSocket:
    """A WebSocket client; an `Origin` in headers is sent as the only Origin (none is sent otherwise)."""
    headers = dict(headers)
    origin = headers.pop("Origin", None)
    header = [f"{k}: {v}" for k, v in headers.items()]
    origin_options = {"origin": origin} if origin else {"suppress_origin": True}
    url = ws_url(base, cursor, params)
    return websocket.create_connection(url, header=header, timeout=10, **origin_options, **options)


def ws_json(ws: websocket.WebSocket, timeout: float = 5.0) -> dict:
    ws.settimeout(timeout)
    return json.loads(ws.recv())


def ws_close_code(ws: websocket.WebSocket, timeout: float = 5.0) -> int | None:
    """Read until the server's close frame; its status code (None if the connection just dropped)."""
    ws.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            opcode, data = ws.recv_data(control_frame=True)
        except websocket.WebSocketConnectionClosedException:
            return None
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return int.from_bytes(data[:2], "big") if len(data) >= 2 else None
    raise TimeoutError("no close frame")
