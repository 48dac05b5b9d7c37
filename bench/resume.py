"""SSE clients that resume as EventSource does: each keeps the `id:` of the last event it read and, when
its stream ends or its connection fails, connects again with `Last-Event-ID` after the stream's `retry:`.

For reconnect storms and restarts: every client records when each of its connections was attempted and
opened, how each failed (reset, refused, timed out, an HTTP status), and every numbered event it read
(bench/streams.py `tag`), so a run can tell whether every event arrived exactly once across reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing
import os
import re
import time
from dataclasses import dataclass, field, replace

from bench.streams import Receiver, Target, open_stream, raise_fd_limit

DEFAULT_RETRY = 2.0  # seconds, until a stream's `retry:` says otherwise (browsers wait about 3 s)
IDLE_CHECK = 5.0  # seconds a client waits for data before it looks whether it is done (a run's end is that late)


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
    niceness: int = 0  # the client processes' (os.nice): 10 leaves the servers the CPU first
    # A client that has read every event keeps its stream open until every client of the fleet has, as clients
    # back after a storm stay. One leaving early costs the server a close in the middle of the storm.
    hold: bool = False


@dataclass
class Client:
    attempts: list[float] = field(default_factory=list)  # wall time of each connection attempt
    outcomes: list[str] = field(default_factory=list)  # per attempt: "open", or how it failed
    opened: list[float] = field(default_factory=list)  # wall time each opened stream opened
    seen: list[int] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    complete: bool = False  # has read every event (and is counted in its fleet's `finished`)


def failure_kind(error: BaseException) -> str:
    if isinstance(error, ConnectionResetError):
        return "reset"
    if isinstance(error, ConnectionRefusedError):
        return "refused"
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, asyncio.IncompleteReadError):
        return "closed before answering"
    if isinstance(error, RuntimeError):  # open_stream: a status other than 200 (its status line)
        return str(error)[:40]
    return type(error).__name__


class EventReader:
    """An open stream's SSE events, read as its data arrives (`Receiver`): their numbers, arrival times,
    the last `id:` and the `retry:` given."""

    def __init__(self, stream, token: bytes, client: Client, done):
        self.client, self.done = client, done
        self.pattern = re.compile(re.escape(token) + rb":(\d+);")
        self.buffer, self.cursor, self.retry = b"", None, None
        self.ended = Receiver(stream, self.events).ended

    def events(self, data: bytes) -> bool:
        """Note the events in `data`; True once the client is done."""
        self.buffer += data.replace(b"\r\n", b"\n")
        *blocks, self.buffer = self.buffer.split(b"\n\n")
        now, client = time.time(), self.client
        for block in blocks:
            for line in block.split(b"\n"):
                if line.startswith(b"id:"):
                    self.cursor = line[3:].strip().decode()
                elif line.startswith(b"retry:"):
                    self.retry = int(line[6:].strip()) / 1000
            for match in self.pattern.finditer(block):
                client.seen.append(int(match.group(1)))
                client.arrivals.append(now)
        return self.done()


async def read_events(stream, token: bytes, client: Client, done) -> tuple[str | None, float | None]:
    """Read SSE events until the stream ends or `done()`: the last `id:` read, and the `retry:` given."""
    reader = EventReader(stream, token, client, done)
    while not reader.ended.done() and not done():
        # `done()` may turn true while nothing arrives: an idle stream looks every IDLE_CHECK s (20,000
        # looking every second took about a core).
        await asyncio.wait([reader.ended], timeout=IDLE_CHECK)
    return reader.cursor, reader.retry


def has_read(client: Client, expected) -> bool:
    return len(client.seen) >= len(expected) and set(expected).issubset(client.seen)  # the first test is cheap


async def run_client(plan: Plan, index: int, done, first_opened=lambda: None, held=None) -> Client:
    """One client: connects at its time, reads, and resumes from its last `id:` until `done(client)`;
    `first_opened()` is called when its first stream opens; with `held` (awaitable), its last stream stays
    open until that is done."""
    client, cursor, retry = Client(), plan.cursor, DEFAULT_RETRY
    await asyncio.sleep(max(0.0, plan.start_at + plan.spread * index / plan.count - time.time()))
    while not done(client):
        headers = {**plan.target.headers, **({"Last-Event-ID": cursor} if cursor else {})}
        client.attempts.append(time.time())
        stream = None
        try:
            opening = open_stream(replace(plan.target, headers=headers), plan.source)
            stream = await asyncio.wait_for(opening, OPEN_TIMEOUT)
            client.opened.append(time.time())
            client.outcomes.append("open")
            if len(client.opened) == 1:
                first_opened()
            last, given = await read_events(stream, plan.token, client, lambda: done(client))
            cursor, retry = last or cursor, given or retry
        except (TimeoutError, OSError, RuntimeError, asyncio.IncompleteReadError) as error:
            if len(client.outcomes) < len(client.attempts):  # the attempt failed before its stream opened
                client.outcomes.append(failure_kind(error))
        finally:
            if stream is not None:
                if held is not None and done(client):
                    await held()
                stream.writer.close()
        if not done(client):
            await asyncio.sleep(retry)
    return client


OPEN_TIMEOUT = 60  # seconds for one attempt to open its stream


def _client_process(plan: Plan, ready, results, final, deadline, opened, finished, fleet_size: int) -> None:
    """`final`: the last event number once it is known (0 before), when `plan.expected` is empty;
    `deadline`: the wall time the clients give up (the smaller of it and plan.stop_at); `opened`: counts
    the clients whose first stream opened; `finished`: the fleet's clients that have read every event."""
    raise_fd_limit()
    os.nice(plan.niceness)

    def first_opened() -> None:
        with opened.get_lock():
            opened.value += 1

    def done(client: Client) -> bool:
        if client.complete or time.time() >= min(plan.stop_at, deadline.value):
            return True
        if plan.expected:
            client.complete = has_read(client, plan.expected)
        else:
            client.complete = final.value > 0 and has_read(client, range(1, final.value + 1))
        if client.complete:
            with finished.get_lock():
                finished.value += 1
        return client.complete

    async def release_when_all_finished(release: asyncio.Event) -> None:
        while finished.value < fleet_size and time.time() < min(plan.stop_at, deadline.value):
            await asyncio.sleep(0.2)
        release.set()

    async def main():
        release = asyncio.Event()  # one task watches the fleet for all the held clients
        watcher = asyncio.create_task(release_when_all_finished(release)) if plan.hold else None
        held = release.wait if plan.hold else None
        clients = await asyncio.gather(*(run_client(plan, i, done, first_opened, held) for i in range(plan.count)))
        if watcher is not None:
            await watcher
        results.put([vars(c) for c in clients])

    ready.put(os.getpid())
    asyncio.run(main())


class ResumingFleet:
    """`count` resuming clients across `processes` processes, each from its own loopback source address."""

    def __init__(self, plan: Plan, processes: int, publisher=None):
        context = multiprocessing.get_context("fork")
        self.ready, self.results = context.Queue(), context.Queue()
        self.final, self.deadline = context.Value("q", 0), context.Value("d", math.inf)
        self.opened = context.Value("q", 0)  # clients whose first stream opened
        self.finished = context.Value("q", 0)  # clients that have read every event
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
            args = (mine, self.ready, self.results, self.final, self.deadline, self.opened, self.finished, plan.count)
            self.workers.append(context.Process(target=_client_process, args=args))

    def start(self) -> None:
        for worker in self.workers:
            worker.start()
        for _ in self.workers:
            self.ready.get(timeout=60)

    def wait_opened(self, count: int, timeout: float) -> bool:
        """Whether `count` clients have opened their first stream within `timeout` seconds."""
        deadline = time.time() + timeout
        while self.opened.value < count and time.time() < deadline:
            time.sleep(0.2)
        return self.opened.value >= count

    def collect(self, expected: list[int] | None = None, until: float = math.inf, timeout: float = 150) -> list[Client]:
        """Every client's record, once each has read `expected` (1..its last, for a plan without
        expectations) or `until` has passed."""
        if expected:
            self.final.value = max(expected)
        self.deadline.value = until
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
