"""SSE clients that resume as EventSource does: each keeps the `id:` of the last event it read and, when
its stream ends or its connection fails, connects again with `Last-Event-ID` after the stream's `retry:`.

For reconnect storms and restarts: every client records when each of its connections was attempted and
opened, how each failed (reset, refused, timed out, an HTTP status), and every numbered event it read
(bench/streams.py `tag`), so a run can tell whether every event arrived exactly once across reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import re
import time
from dataclasses import dataclass, field, replace

from bench.streams import Target, open_stream, raise_fd_limit

DEFAULT_RETRY = 2.0  # seconds, until a stream's `retry:` says otherwise (browsers wait about 3 s)


@dataclass
class Plan:
    """What one client process does: `count` clients, the i-th first connecting at start_at + i * spread / count."""

    target: Target
    count: int
    cursor: str | None
    token: bytes
    expected: list[int]  # the event numbers every client must read once each, in this order
    start_at: float
    spread: float
    stop_at: float  # wall time the clients give up
    source: tuple[str, int] | None = None
    first_only: bool = False  # a failed first connection is recorded and not tried again


@dataclass
class Client:
    attempts: list[float] = field(default_factory=list)  # wall time of each connection attempt
    outcomes: list[str] = field(default_factory=list)  # per attempt: "open", or how it failed
    opened: list[float] = field(default_factory=list)  # wall time each opened stream opened
    seen: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    ended_by_server: int = 0


def failure_kind(error: BaseException) -> str:
    if isinstance(error, ConnectionResetError):
        return "reset"
    if isinstance(error, ConnectionRefusedError):
        return "refused"
    if isinstance(error, asyncio.TimeoutError | TimeoutError):
        return "timed out"
    if isinstance(error, asyncio.IncompleteReadError):
        return "closed before answering"
    if isinstance(error, RuntimeError):  # open_stream: a status other than 200 (its status line)
        return str(error)[:40]
    return type(error).__name__


async def read_events(stream, token: bytes, client: Client, expected: set[int]) -> tuple[str | None, float | None]:
    """Read SSE events until the stream ends or every expected number arrived: the last `id:`, the `retry:`."""
    pattern = re.compile(re.escape(token) + rb":(\d+);")
    buffer, cursor, retry = b"", None, None
    while not expected.issubset(client.seen):
        data = await stream.read()
        if not data:
            client.ended_by_server += 1
            break
        buffer += data.replace(b"\r\n", b"\n")
        *blocks, buffer = buffer.split(b"\n\n")
        now = time.time()
        for block in blocks:
            for line in block.split(b"\n"):
                if line.startswith(b"id:"):
                    cursor = line[3:].strip().decode()
                elif line.startswith(b"retry:"):
                    retry = int(line[6:].strip()) / 1000
            for match in pattern.finditer(block):
                client.seen.append(int(match.group(1)))
                client.arrivals.append(now)
    return cursor, retry


async def run_client(plan: Plan, index: int) -> Client:
    client, cursor, retry = Client(), plan.cursor, DEFAULT_RETRY
    expected = set(plan.expected)
    await asyncio.sleep(max(0.0, plan.start_at + plan.spread * index / plan.count - time.time()))
    while time.time() < plan.stop_at and not expected.issubset(client.seen):
        headers = {**plan.target.headers, **({"Last-Event-ID": cursor} if cursor else {})}
        client.attempts.append(time.time())
        stream = None
        try:
            timeout = max(0.1, plan.stop_at - time.time())
            stream = await asyncio.wait_for(open_stream(replace(plan.target, headers=headers), plan.source), timeout)
            client.opened.append(time.time())
            client.outcomes.append("open")
            last, given = await asyncio.wait_for(read_events(stream, plan.token, client, expected), timeout)
            cursor, retry = last or cursor, given or retry
        except (TimeoutError, OSError, RuntimeError, asyncio.IncompleteReadError) as error:
            if len(client.outcomes) < len(client.attempts):  # the attempt failed before its stream opened
                client.outcomes.append(failure_kind(error))
                if plan.first_only:
                    break
        finally:
            if stream is not None:
                stream.writer.close()
        if not expected.issubset(client.seen):
            await asyncio.sleep(retry)
    return client


def _client_process(plan: Plan, ready, results) -> None:
    raise_fd_limit()

    async def main():
        clients = await asyncio.gather(*(run_client(plan, i) for i in range(plan.count)))
        results.put([vars(c) for c in clients])

    ready.put(os.getpid())
    asyncio.run(main())


class ResumingFleet:
    """`count` resuming clients across `processes` processes, each from its own loopback source address."""

    def __init__(self, plan: Plan, processes: int):
        context = multiprocessing.get_context("fork")
        self.ready, self.results = context.Queue(), context.Queue()
        self.workers = []
        for index in range(processes):
            share = plan.count // processes + (1 if index < plan.count % processes else 0)
            # Each process's clients start interleaved with the others' over the same spread.
            mine = replace(
                plan,
                count=share,
                start_at=plan.start_at + plan.spread * index / plan.count,
                source=(f"127.0.2.{index + 1}", 0) if plan.target.host.startswith("127.") else None,
            )
            self.workers.append(context.Process(target=_client_process, args=(mine, self.ready, self.results)))

    def start(self) -> None:
        for worker in self.workers:
            worker.start()
        for _ in self.workers:
            self.ready.get(timeout=60)

    def collect(self, timeout: float) -> list[Client]:
        clients: list[Client] = []
        for _ in self.workers:
            clients += [Client(**fields) for fields in self.results.get(timeout=timeout)]
        for worker in self.workers:
            worker.join(10)
            with contextlib.suppress(Exception):
                worker.kill()
        return clients


def exactness(clients: list[Client], expected: list[int]) -> dict:
    """Summed over the clients: expected events missing, events read twice, read out of order, unexpected."""
    wanted = set(expected)
    missing = duplicates = out_of_order = unexpected = 0
    for client in clients:
        seen = client.seen
        missing += len(wanted - set(seen))
        duplicates += len(seen) - len(set(seen))
        unexpected += sum(1 for n in set(seen) if n not in wanted)
        out_of_order += sum(1 for a, b in zip(seen, seen[1:], strict=False) if b < a)
    return {"missing": missing, "duplicates": duplicates, "out_of_order": out_of_order, "unexpected": unexpected}
