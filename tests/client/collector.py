"""A reader iterated on its own thread, for tests that wait for what it yields."""

from __future__ import annotations

import queue
import threading
import time

from auth_rt_client import Event, EventReader

from tests.servers import wait_until


class Collector:
    """Iterates a reader on its own thread; each event arrives with the reader's cursor just after it."""

    def __init__(self, reader: EventReader):
        self.reader = reader
        self.received: queue.Queue[tuple[Event, str | None]] = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_until(lambda: reader.cursor is not None or self.error, message="the reader to fix its position")

    def _run(self) -> None:
        try:
            for event in self.reader:
                self.received.put((event, self.reader.cursor))
        except BaseException as error:  # noqa: BLE001 - handed to the test
            self.error = error

    def take(self, count: int, timeout: float = 15.0) -> list[tuple[Event, str | None]]:
        deadline = time.monotonic() + timeout
        taken = []
        while len(taken) < count:
            remaining = deadline - time.monotonic()
            assert remaining > 0 and not self.error, f"got {len(taken)} of {count} events; error {self.error!r}"
            try:
                taken.append(self.received.get(timeout=min(remaining, 0.2)))
            except queue.Empty:
                continue
        return taken

    def events(self, count: int, timeout: float = 15.0) -> list[Event]:
        return [event for event, _ in self.take(count, timeout)]

    def stop(self) -> None:
        self.reader.close()
        self.thread.join(5)
        assert not self.thread.is_alive(), "close() did not end the iteration"

    def raised(self, timeout: float = 10.0) -> BaseException:
        self.thread.join(timeout)
        assert not self.thread.is_alive() and self.error is not None, "the reader did not raise"
        return self.error

    def until(self, predicate, timeout: float = 15.0) -> list[Event]:
        """Every event up to and including the first that `predicate` accepts."""
        deadline = time.monotonic() + timeout
        taken: list[Event] = []
        while not taken or not predicate(taken[-1]):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no matching event among {taken!r}; error {self.error!r}"
            taken += self.events(1, timeout=remaining)
        return taken
