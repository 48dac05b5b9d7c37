"""The load generator: many idle streams from several client processes, and what reaches them.

Each client process runs asyncio on raw sockets (no HTTP library in the hot path). It decodes the
framing (chunked transfer coding, WebSocket frames), finds the numbered tags of the run's events in the
decoded body (`tag(token, n)`) and checks each stream exactly: every event once, in each publisher's
order. Processes report their own CPU time, so the report can show the generator was not the bottleneck.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import os
import re
import resource
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

OPEN_CONCURRENCY = 100
OPEN_TIMEOUT = 60  # seconds for one stream to open; one still waiting then is counted as never opened
READ_TIMEOUT = 120


@dataclass
class Target:
    name: str
    host: str
    port: int
    path: str
    headers: dict = field(default_factory=dict)
    transport: str = "sse"  # sse | ws
    opened_when: bytes = b"\r\n\r\n"  # bytes that show the stream is open (after the headers)
    headers_first: bool = True  # False: the server sends nothing until the first event (flask-sse)


def raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Chunked:
    """Transfer-Encoding: chunked, decoded as bytes arrive: a chunk header may fall anywhere, even inside
    an event, so counting in the raw bytes would miss events split by one."""

    def __init__(self):
        self.buffer = b""
        self.remaining = 0  # bytes of the current chunk still to come
        self.crlf_due = False  # the CRLF that ends a chunk's data
        self.ended = False  # the last (empty) chunk came: the response is complete

    def feed(self, data: bytes) -> bytes:
        if self.ended:
            return b""
        self.buffer += data
        out = []
        while True:
            if self.remaining:
                piece = self.buffer[: self.remaining]
                out.append(piece)
                self.remaining -= len(piece)
                self.buffer = self.buffer[len(piece) :]
                if self.remaining:
                    break
                self.crlf_due = True
            if self.crlf_due:
                if len(self.buffer) < 2:
                    break
                self.buffer, self.crlf_due = self.buffer[2:], False
            line_end = self.buffer.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self.buffer[:line_end].split(b";")[0], 16)
            self.buffer = self.buffer[line_end + 2 :]
            if size == 0:
                self.ended = True
                break
            self.remaining = size
        return b"".join(out)


class WebSocketFrames:
    """Server-to-client WebSocket frames (unmasked), decoded to their payloads, one per line."""

    def __init__(self):
        self.buffer = b""

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out = []
        while len(self.buffer) >= 2:
            length, header = self.buffer[1] & 0x7F, 2
            if length == 126:
                if len(self.buffer) < 4:
                    break
                length, header = struct.unpack("!H", self.buffer[2:4])[0], 4
            elif length == 127:
                if len(self.buffer) < 10:
                    break
                length, header = struct.unpack("!Q", self.buffer[2:10])[0], 10
            if len(self.buffer) < header + length:
                break
            if self.buffer[0] & 0x0F in (0, 1, 2):  # continuation, text, binary
                out.append(self.buffer[header : header + length] + b"\n")
            self.buffer = self.buffer[header + length :]
        return b"".join(out)


class Deferred:
    """For a server that sends its response head only with the first event: the head, then its framing."""

    def __init__(self):
        self.head = b""
        self.decoder: Chunked | Plain | None = None

    def feed(self, data: bytes) -> bytes:
        if self.decoder is not None:
            return self.decoder.feed(data)
        self.head += data
        if b"\r\n\r\n" not in self.head:
            return b""
        head, body = self.head.split(b"\r\n\r\n", 1)
        self.decoder = Chunked() if b"transfer-encoding: chunked" in head.lower() else Plain()
        return self.decoder.feed(body)


class Plain:
    """A body sent as it is (no chunked framing)."""

    @staticmethod
    def feed(data: bytes) -> bytes:
        return data


@dataclass
class Stream:
    """An open stream: its socket, the decoder of its framing, and decoded bytes not yet examined."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    decoder: Chunked | WebSocketFrames | Deferred | Plain
    pending: bytes = b""

    async def read(self) -> bytes:
        """The next decoded bytes ("" once the server closed)."""
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        while True:
            chunk = await self.reader.read(65536)
            if not chunk:
                return b""
            data = self.decoder.feed(chunk)
            if data:
                return data


class Receiver(asyncio.Protocol):
    """Takes an open stream's connection over from its StreamReader and passes its decoded data to
    `on_data` as it arrives, in the event loop's own callback: no task wakes and no read is awaited per
    event. The client processes share the servers' cores, and what they spend per event is taken from the
    servers: reading through the StreamReader cost about 50 us of client CPU per event, this about 16.
    `ended` is done once the server closes the connection or `on_data` returns True (it has read enough)."""

    def __init__(self, stream: Stream, on_data: Callable[[bytes], bool]):
        self.decoder, self.on_data = stream.decoder, on_data
        self.ended = asyncio.get_running_loop().create_future()
        reader, transport = stream.reader, stream.writer.transport
        received, closed = bytes(reader._buffer), reader._eof  # what the StreamReader holds, not yet read
        reader._buffer.clear()
        transport.set_protocol(self)
        if stream.pending and on_data(stream.pending):
            self.finish()
        if received:
            self.data_received(received)
        if closed or transport.is_closing():
            self.finish()
        elif not self.ended.done():
            transport.resume_reading()  # the StreamReader may have paused it

    def data_received(self, data: bytes) -> None:
        if self.ended.done():
            return
        decoded = self.decoder.feed(data)
        if decoded and self.on_data(decoded):
            self.finish()

    def eof_received(self) -> None:
        self.finish()

    def connection_lost(self, exc) -> None:
        self.finish()

    def finish(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


def source_address(index: int, target: Target) -> tuple[str, int] | None:
    """A loopback source address of its own for client process `index`.

    One source address has about 28,000 ephemeral ports towards one server port: 40,000 streams need more
    than one. Every 127.x.y.z is this machine, so each client process connects from its own.
    """
    return (f"127.0.1.{index + 1}", 0) if target.host.startswith("127.") else None


IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # Linux 4.2+


async def connect_from(source: tuple[str, int], host: str, port: int) -> socket.socket:
    """A connection from the source address, its port chosen at connect time (IP_BIND_ADDRESS_NO_PORT).

    A port chosen at bind time is held for every destination: 10,000 such streams to nginx would take
    10,000 ports from the machine's ephemeral range, and nginx's own connections to the service then
    run out of ports (EADDRNOTAVAIL, a 502).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        sock.bind(source)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def open_stream(target: Target, source: tuple[str, int] | None = None) -> Stream:
    if source is None:
        reader, writer = await asyncio.open_connection(target.host, target.port, limit=2**20)
    else:
        sock = await connect_from(source, target.host, target.port)
        reader, writer = await asyncio.open_connection(sock=sock, limit=2**20)
    lines = [f"GET {target.path} HTTP/1.1", f"Host: {target.host}:{target.port}"]
    if target.transport == "ws":
        key = base64.b64encode(os.urandom(16)).decode()
        lines += ["Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    else:
        lines += ["Accept: text/event-stream", "Cache-Control: no-cache"]
    lines += [f"{k}: {v}" for k, v in target.headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    if not target.headers_first:
        return Stream(reader, writer, Deferred())
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    if b" 200 " not in status and b" 101 " not in status:
        raise RuntimeError(status.decode())
    if target.transport == "ws":
        decoder = WebSocketFrames()
    elif b"transfer-encoding: chunked" in head.lower():
        decoder = Chunked()
    else:
        decoder = Plain()
    stream = Stream(reader, writer, decoder)
    if target.opened_when != b"\r\n\r\n":
        seen = b""
        while target.opened_when not in seen:
            data = await stream.read()
            if not data:
                raise RuntimeError("closed before it opened")
            seen += data
        stream.pending = seen[seen.index(target.opened_when) + len(target.opened_when) :]
    return stream


def tag(token: str, n: int) -> str:
    """What event number `n` of a run carries: the run's token, the number and a terminator."""
    return f"{token}:{n};"


async def read_tags(stream: Stream, token: bytes, expected: int, arrivals: list, seen: list) -> bool:
    """Read until `expected` different event numbers of this run arrived; note each number and its time.

    False if the server closed the stream first.
    """
    finder = TagFinder(token, arrivals, seen)
    while len(finder.unique) < expected:
        data = await stream.read()
        if not data:
            return False
        finder.feed(data)
    return True


async def receive_tags(stream: Stream, token: bytes, expected: int, arrivals: list, seen: list) -> bool:
    """`read_tags` for a stream read to its end: the stream's connection is taken over (`Receiver`), and
    nothing else reads it afterwards."""
    finder = TagFinder(token, arrivals, seen)

    def on_data(data: bytes) -> bool:
        finder.feed(data)
        return len(finder.unique) >= expected

    await Receiver(stream, on_data).ended
    return len(finder.unique) >= expected


class TagFinder:
    """The numbered tags of a run in a stream's decoded data, each noted with the time it arrived."""

    def __init__(self, token: bytes, arrivals: list, seen: list):
        self.pattern = re.compile(re.escape(token) + rb":(\d+);")
        self.keep = len(token) + 24  # the longest partial tag that may continue in the next data
        self.window, self.unique, self.arrivals, self.seen = b"", set(), arrivals, seen

    def feed(self, data: bytes) -> None:
        window = self.window + data
        now, last_end = time.time(), 0
        for match in self.pattern.finditer(window):
            n = int(match.group(1))
            self.seen.append(n)
            self.arrivals.append(now)
            self.unique.add(n)
            last_end = match.end()
        self.window = window[last_end:][-self.keep :]


def verdict(seen: list[int], expected: int, publishers: int) -> dict:
    """Exactness of one stream: events missing, delivered twice, or out of order.

    Event n is published by publisher n % `publishers`, each publishing its own numbers in increasing
    order one after the other, so within one publisher the order of arrival must be the order of n.
    """
    unique = set(seen)
    last: dict[int, int] = {}
    out_of_order = 0
    for n in seen:
        if last.get(n % publishers, -1) > n:
            out_of_order += 1
        last[n % publishers] = max(n, last.get(n % publishers, -1))
    return {
        "missing": len(set(range(expected)) - unique),
        "duplicates": len(seen) - len(unique),
        "out_of_order": out_of_order,
    }


def _client_process(
    targets: list[Target],
    token: bytes,
    expected: int,
    publishers: int,
    timeout: float,
    ready,
    results,
    source: tuple[str, int] | None = None,
    niceness: int = 0,
) -> None:
    raise_fd_limit()
    os.nice(niceness)

    async def main():
        started = time.perf_counter()
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)

        async def one(target: Target):
            async with gate:  # a stream the server never answers (it holds all it can) is not opened
                with contextlib.suppress(OSError, RuntimeError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                    return await asyncio.wait_for(open_stream(target, source), OPEN_TIMEOUT)
                return None

        opened = await asyncio.gather(*(one(target) for target in targets))
        streams = [stream for stream in opened if stream is not None]
        ready.put((len(streams), time.perf_counter() - started))
        per_connection = [[] for _ in streams]
        numbers = [[] for _ in streams]
        readers = [
            receive_tags(stream, token, expected, arrivals, seen)
            for stream, arrivals, seen in zip(streams, per_connection, numbers, strict=True)
        ]
        cpu_before = os.times()
        tasks = [asyncio.ensure_future(r) for r in readers]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)  # what has not arrived by then is reported as missing
        cpu_after = os.times()
        for stream in streams:
            stream.writer.close()
        cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        verdicts = [verdict(seen, expected, publishers) for seen in numbers]
        for task, each in zip(tasks, verdicts, strict=True):
            each["closed_by_server"] = task.done() and not task.cancelled() and task.result() is False
            task.cancel()
        unopened = len(opened) - len(streams)
        per_connection += [[] for _ in range(unopened)]  # each unopened stream misses every event
        verdicts += [verdict([], expected, publishers) | {"closed_by_server": False} for _ in range(unopened)]
        results.put({"arrivals": per_connection, "verdicts": verdicts, "cpu_seconds": cpu, "unopened": unopened})

    asyncio.run(main())


@dataclass
class Run:
    open_seconds: float
    arrivals: list[list[float]]  # per connection, the wall time each token arrived
    client_cpu_seconds: float
    read_wall_seconds: float


class StreamFleet:
    """N streams across `processes` client processes; `measure()` runs while they are open."""

    def __init__(
        self,
        target: Target,
        count: int,
        token: str,
        expected: int = 1,
        processes: int = 2,
        timeout: float = READ_TIMEOUT,
        publishers: int = 1,
        targets: list[Target] | None = None,
        niceness: int = 0,
    ):
        """`targets`: one target per stream (e.g. each user's own), instead of `count` streams to `target`.
        `niceness`: the client processes' (os.nice), to give the servers the CPU first."""
        every = targets if targets is not None else [target] * count
        self.target, self.count, self.token, self.expected = target, len(every), token.encode(), expected
        self.timeout = timeout
        self.processes = max(1, min(processes, self.count))
        context = multiprocessing.get_context("fork")
        self.ready, self.results = context.Queue(), context.Queue()
        shares = [every[i :: self.processes] for i in range(self.processes)]
        self.workers = [
            context.Process(
                target=_client_process,
                args=(share, self.token, expected, publishers, timeout, self.ready, self.results),
                kwargs={"source": source_address(index, share[0]), "niceness": niceness},
            )
            for index, share in enumerate(shares)
        ]

    def open(self, timeout: float = 600) -> float:
        started = time.perf_counter()
        for worker in self.workers:
            worker.start()
        for _ in self.workers:
            self.ready.get(timeout=timeout)
        return time.perf_counter() - started

    def collect(self) -> tuple[list[list[float]], float]:
        """Per stream the arrival time of each event, and the client processes' CPU seconds.

        `self.verdicts` then holds per stream what was missing, delivered twice or out of order.
        """
        arrivals, cpu = [], 0.0
        self.verdicts: list[dict] = []
        self.unopened = 0
        for _ in self.workers:
            result = self.results.get(timeout=self.timeout + 30)
            self.unopened += result["unopened"]
            arrivals += result["arrivals"]
            self.verdicts += result["verdicts"]
            cpu += result["cpu_seconds"]
        for worker in self.workers:
            worker.join(10)
        return arrivals, cpu


@dataclass
class RawPublish:
    """How a system takes one publish over HTTP: sent by `_single_latency` on one keep-alive connection
    from its own event loop, so the client adds no HTTP library and no thread hop to the latency."""

    host: str
    port: int
    path: str
    headers: dict
    body: Callable[[str], bytes]

    def request(self, text: str) -> bytes:
        body = self.body(text)
        lines = [f"POST {self.path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def answered(reader: asyncio.StreamReader) -> bool:
    """Read one answer (2xx or raise); False when the server closes the connection after it."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 2"):
        raise RuntimeError(head.split(b"\r\n", 1)[0].decode())
    length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    await reader.readexactly(int(length.group(1)) if length else 0)
    return b"connection: close" not in head.lower()


async def _single_latency(target: Target, publish: RawPublish, count: int) -> list[float]:
    """One stream: publish, wait for that event, repeat. Publish-to-receive seconds per event."""
    if not target.headers_first:
        raise ValueError("needs a target that answers before its first event")
    stream = await open_stream(target)
    reader, writer = await asyncio.open_connection(publish.host, publish.port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    latencies = []
    for n in range(count):
        token = f"single-{n}-{os.getpid()}"
        arrivals: list[float] = []
        waiter = asyncio.ensure_future(read_tags(stream, token.encode(), 1, arrivals, []))
        started = time.time()
        writer.write(publish.request(tag(token, 0)))
        await answered(reader)
        await asyncio.wait_for(waiter, 10)
        latencies.append(arrivals[0] - started)
    writer.close()
    stream.writer.close()
    return latencies


def single_latency(target: Target, publish: RawPublish, count: int) -> list[float]:
    return asyncio.run(_single_latency(target, publish, count))
