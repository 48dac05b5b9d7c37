"""The load generator: many idle streams from several client processes, and what reaches them.

Each client process runs asyncio on raw sockets (no HTTP library in the hot path) and only counts
occurrences of a per-run token in what it reads, so it stays cheap next to the server. Processes
report their own CPU time, so the report can show the generator was not the bottleneck.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import multiprocessing
import os
import resource
import time
from dataclasses import dataclass, field

OPEN_CONCURRENCY = 100
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


async def open_stream(target: Target):
    reader, writer = await asyncio.open_connection(target.host, target.port, limit=2**20)
    lines = [f"GET {target.path} HTTP/1.1", f"Host: {target.host}:{target.port}"]
    if target.transport == "ws":
        key = base64.b64encode(os.urandom(16)).decode()
        lines += ["Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
    else:
        lines += ["Accept: text/event-stream", "Cache-Control: no-cache"]
    lines += [f"{k}: {v}" for k, v in target.headers.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await writer.drain()
    if target.headers_first:
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 200 " not in status and b" 101 " not in status:
            raise RuntimeError(status.decode())
        if target.opened_when != b"\r\n\r\n":
            await reader.readuntil(target.opened_when)
    return reader, writer


async def count_tokens(reader, token: bytes, expected: int, arrivals: list) -> None:
    """Read until `expected` tokens were seen; note the wall time of each."""
    seen, tail = 0, b""
    while seen < expected:
        chunk = await reader.read(65536)
        if not chunk:
            return
        window = tail + chunk
        found = window.count(token) - tail.count(token)
        now = time.time()
        arrivals.extend([now] * min(found, expected - seen))
        seen += found
        tail = window[-(len(token) - 1) :] if len(token) > 1 else b""


def _client_process(target: Target, count: int, token: bytes, expected: int, timeout: float, ready, results) -> None:
    raise_fd_limit()

    async def main():
        started = time.perf_counter()
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)

        async def one():
            async with gate:
                return await open_stream(target)

        connections = await asyncio.gather(*(one() for _ in range(count)))
        ready.put((count, time.perf_counter() - started))
        per_connection = [[] for _ in connections]
        readers = [
            count_tokens(r, token, expected, arrivals)
            for (r, _), arrivals in zip(connections, per_connection, strict=True)
        ]
        cpu_before = os.times()
        with contextlib.suppress(TimeoutError):  # what has not arrived by then is reported as missing
            await asyncio.wait_for(asyncio.gather(*readers), timeout)
        cpu_after = os.times()
        for _, writer in connections:
            writer.close()
        cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        results.put({"arrivals": per_connection, "cpu_seconds": cpu})

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
    ):
        self.target, self.count, self.token, self.expected = target, count, token.encode(), expected
        self.timeout = timeout
        self.processes = max(1, min(processes, count))
        context = multiprocessing.get_context("fork")
        self.ready, self.results = context.Queue(), context.Queue()
        shares = [count // self.processes + (1 if i < count % self.processes else 0) for i in range(self.processes)]
        self.workers = [
            context.Process(
                target=_client_process, args=(target, n, self.token, expected, timeout, self.ready, self.results)
            )
            for n in shares
        ]

    def open(self, timeout: float = 300) -> float:
        started = time.perf_counter()
        for worker in self.workers:
            worker.start()
        for _ in self.workers:
            self.ready.get(timeout=timeout)
        return time.perf_counter() - started

    def collect(self) -> tuple[list[list[float]], float]:
        arrivals, cpu = [], 0.0
        for _ in self.workers:
            result = self.results.get(timeout=self.timeout + 30)
            arrivals += result["arrivals"]
            cpu += result["cpu_seconds"]
        for worker in self.workers:
            worker.join(10)
        return arrivals, cpu


async def _single_latency(target: Target, publish, count: int) -> list[float]:
    """One stream: publish, wait for that event, repeat. Publish-to-receive seconds per event."""
    if not target.headers_first:
        raise ValueError("needs a target that answers before its first event")
    reader, writer = await open_stream(target)
    latencies, loop = [], asyncio.get_running_loop()
    for n in range(count):
        token = f"single-{n}-{os.getpid()}-".encode()
        arrivals: list[float] = []
        waiter = asyncio.ensure_future(count_tokens(reader, token, 1, arrivals))
        started = time.time()
        await loop.run_in_executor(None, publish, token.decode())
        await asyncio.wait_for(waiter, 10)
        latencies.append(arrivals[0] - started)
    writer.close()
    return latencies


def single_latency(target: Target, publish, count: int) -> list[float]:
    return asyncio.run(_single_latency(target, publish, count))
