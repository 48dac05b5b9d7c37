"""gunicorn's gevent worker, giving every connection its turn between keep-alive requests.

gunicorn's keep-alive loop (AsyncWorker.handle) reads a connection's next request right after writing
the last response, and gevent's socket returns data already buffered without passing through the hub.
Under load a client has sent its next request by then, so one greenlet served the same connection
again and again: the worker's other connections (and the listening socket: new connections waited in
the kernel's queue) got no turn for hundreds of milliseconds. `wrk -c64` on GET /healthz had a p50 of
about 1 ms and a p99 of about a second. Waiting once for the event loop between two requests of a
connection serves every connection with a request in turn, and accepts new ones in between.

Its responses also send their head with the first piece of their body in one write (HeadWithBody), and
when it stops it closes the connections that wait for a request (`close_idle_connections`).

The workers also share out the connections they serve (BalancedAccept). They accept from one listening
socket, and whichever wakes first takes the next connection: a backend's 16 keep-alive connections, opened
together, sat 15 on one worker and 1 on the other, so one core did all the publishing while the other idled.
Each worker now counts the connections in its handlers in memory shared with its siblings, and one that holds
more than the fewest of them (by more than one) leaves the next connection to the others for a moment.

Referenced by name from gunicorn.conf.py (`worker_class`). It lives outside the `app` package because
the arbiter imports the worker class, and importing `app` there would import the whole app early. The
hub's fan-out takes its turns the same way (app/events/links.py, `next_turn`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import struct
import time
import weakref

import gevent
import gunicorn.http.message
import gunicorn.http.wsgi
import gunicorn.util
from gevent.server import StreamServer
from gunicorn.workers import ggevent
from gunicorn.workers.ggevent import GeventWorker

from quick_http import QuickRequests

SLOT = struct.Struct("qq")  # a worker's pid and the number of connections in its handlers
SLOTS = 64
# Made when the arbiter imports this module, so every worker it forks shares it.
SHARED_COUNTS = mmap.mmap(-1, SLOT.size * SLOTS)


class Gathered:
    """A stand-in for a socket: keeps what is written to it."""

    __slots__ = ("parts",)

    def __init__(self):
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.parts.append(data)


class HeadWithBody(gunicorn.http.wsgi.Response):
    """gunicorn's response, sending its head with the first piece of its body in one write, not two.

    Every response then costs the worker one system call less, and the client one wake-up: an event stream's
    head, its opening lines and the history it read arrive together.
    """

    def write(self, arg):
        """gunicorn's write; the first one's head and (framed) body gathered and sent as one."""
        if self.headers_sent:
            super().write(arg)
            return
        sock, gathered = self.sock, Gathered()
        self.sock = gathered
        try:
            super().write(arg)
        finally:
            self.sock = sock
            if gathered.parts:
                sock.sendall(b"".join(gathered.parts))


class BalancedAccept:
    """Whether this worker should leave the next connection to a sibling: it holds more connections in its
    handlers than the fewest a live sibling holds, beyond a margin (one, or an eighth of that fewest). A sibling
    that takes none for MAX_DEFERRALS pauses in a row (stuck, or too busy to look) is not waited for again for
    IGNORE_SECONDS: a hung worker slows its siblings' accepting by at most a twentieth."""

    PAUSE = 0.002  # seconds before this worker looks at the listening socket again
    MAX_DEFERRALS = 25
    IGNORE_SECONDS = 1.0
    ALIVE_FOR = 0.5  # seconds a sibling found running is taken to run (one that died holds none of its connections)

    def __init__(self, age: int, memory=SHARED_COUNTS):
        self.memory, self.pid = memory, os.getpid()
        self.offset = (age % SLOTS) * SLOT.size
        self.count = 0
        self.deferrals = 0
        self.waiting_again_at = 0.0
        self.alive_until: dict[int, float] = {}  # sibling pid -> until when it is taken to run

    def join(self) -> None:
        """This worker accepts connections from now on: its siblings count it (not while it loads the app)."""
        self._write()

    def _write(self) -> None:
        SLOT.pack_into(self.memory, self.offset, self.pid, self.count)

    def opened(self) -> None:
        self.count += 1
        self._write()

    def closed(self) -> None:
        self.count -= 1
        self._write()

    def leave(self) -> None:
        """This worker stops: its siblings no longer wait for it."""
        SLOT.pack_into(self.memory, self.offset, 0, 0)

    def fewest_of_siblings(self) -> int | None:
        fewest = None
        for pid, count in SLOT.iter_unpack(self.memory):
            if pid in (0, self.pid) or (fewest is not None and count >= fewest) or not self._alive(pid):
                continue
            fewest = count
        return fewest

    def _alive(self, pid: int) -> bool:
        """Whether sibling `pid` runs: a live one is asked of the kernel again after ALIVE_FOR seconds, not at
        every connection accepted (a system call each, during an opening storm)."""
        now = time.monotonic()
        if self.alive_until.get(pid, 0.0) > now:
            return True
        if not _alive(pid):
            self.alive_until.pop(pid, None)
            return False
        if len(self.alive_until) >= SLOTS:  # siblings come and go over a worker's life
            self.alive_until.clear()
        self.alive_until[pid] = now + self.ALIVE_FOR
        return True

    def ahead(self) -> bool:
        """Whether to leave the next connection to the siblings now (see the class's text)."""
        if not self.deferrals and time.monotonic() < self.waiting_again_at:
            return False
        fewest = self.fewest_of_siblings()
        if fewest is None or self.count <= fewest + max(1, fewest // 8):
            self.deferrals = 0
            return False
        if self.deferrals >= self.MAX_DEFERRALS:
            self.deferrals = 0
            self.waiting_again_at = time.monotonic() + self.IGNORE_SECONDS
            return False
        self.deferrals += 1
        return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BalancedStreamServer(StreamServer):
    """gevent's server, which pauses accepting while its worker is ahead of its siblings (BalancedAccept)."""

    balance: BalancedAccept | None = None  # the worker's, set as it starts

    def do_read(self):
        if self.balance is not None and self.balance.ahead():
            self.stop_accepting()
            self._timer = self.loop.timer(BalancedAccept.PAUSE)  # stop_accepting stops it too
            self._timer.start(self._start_accepting_if_started)
            return None
        return super().do_read()


class SettledConfig:
    """gunicorn's configuration, each setting looked up once: gunicorn reads about twenty settings per request,
    each through `Config.__getattr__` and the setting's `get()`, a fifth of a bare request's CPU in this worker.
    Settings do not change in a running worker except through `set`, which passes on and forgets the value."""

    def __init__(self, cfg):
        self.__dict__["_cfg"] = cfg

    def __getattr__(self, name):
        value = getattr(self._cfg, name)
        self.__dict__[name] = value
        return value

    def set(self, name, value) -> None:
        self._cfg.set(name, value)
        self.__dict__.pop(name, None)


def http_date_of_this_second(http_date):
    """gunicorn's `http_date` (the Date header), formatted once a second rather than for every response."""
    last = [None, ""]

    def cached(timestamp=None):
        if timestamp is not None:
            return http_date(timestamp)
        now = int(time.time())
        if last[0] != now:
            last[:] = [now, http_date(now)]
        return last[1]

    return cached


def remembered_allow_list_check(check, limit: int = 4096):
    """gunicorn's check of a peer's address against FORWARDED_ALLOW_IPS (it parses the address for every
    request), remembered per address and list."""
    known: dict = {}

    def remembered(ip_str, allow_list, networks):
        key = (ip_str, tuple(allow_list))
        found = known.get(key)
        if found is None:
            if len(known) >= limit:
                known.clear()
            found = known[key] = check(ip_str, allow_list, networks)
        return found

    return remembered


class FairGeventWorker(GeventWorker):
    """The gevent worker, with a turn of the event loop between two requests of one connection, whose responses
    send their head with their body (HeadWithBody), and which reads the requests its app answers at once itself
    (quick_http.py)."""

    quick: QuickRequests | None = None  # set as it starts serving, when the app has quick routes

    def init_process(self):
        """In the worker only (the arbiter imports this class too): gunicorn's HTTP/1 responses are HeadWithBody."""
        gunicorn.http.wsgi.Response = HeadWithBody
        self.cfg = SettledConfig(self.cfg)
        gunicorn.util.http_date = http_date_of_this_second(gunicorn.util.http_date)
        gunicorn.http.message._ip_in_allow_list = remembered_allow_list_check(gunicorn.http.message._ip_in_allow_list)
        self.idle_connections = weakref.WeakSet()  # waiting for their first or next request
        self.balance = BalancedStreamServer.balance = BalancedAccept(self.age)
        ggevent.StreamServer = BalancedStreamServer
        super().init_process()

    def run(self):
        """Serve; from now on the siblings share connections with this worker."""
        self.quick = QuickRequests.for_worker(self)
        self.balance.join()
        super().run()

    def handle(self, listener, client, addr):
        """Serve a connection; until its first request it is idle."""
        self.idle_connections.add(client)
        self.balance.opened()
        try:
            super().handle(listener, client, addr)
        finally:
            self.balance.closed()

    def handle_request(self, listener_name, req, sock, addr):
        """Serve one request; if the connection stays open, let the loop run once before the next.

        A response that closes the connection (Connection: close, a stream handed over, a worker
        shutting down) raises StopIteration out of here, and so skips the wait.
        """
        self.idle_connections.discard(sock)
        super().handle_request(listener_name, req, sock, addr)
        self.take_turn()
        self.idle_connections.add(sock)
        if self.quick is not None:
            self.quick.serve(req, sock, addr, listener_name)  # the requests that follow, if quick (quick_http.py)

    @staticmethod
    def take_turn() -> None:
        """Let every other ready connection, and new ones, come first."""
        # A 0 s timer rather than gevent.sleep(0): sleep(0) resumes from the loop's callbacks, which
        # run before it polls for I/O, so a greenlet that always sleeps 0 still keeps sockets waiting.
        # The timer fires after the next poll: other ready connections and new ones come first.
        hub = gevent.get_hub()
        with hub.loop.timer(0) as turn:
            hub.wait(turn)

    def count_request(self) -> None:
        """A request served outside gunicorn's handler, counted as gunicorn counts its own (max_requests)."""
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False

    def close_idle_connections(self) -> None:
        """Stopping: close the keep-alive connections that wait for a request, as nginx does. Left open, each
        held the stop for the whole graceful time-out, and was then killed with a traceback in the log.
        A connection serving a request is closed by gunicorn when its response is done."""
        self.balance.leave()
        for sock in list(self.idle_connections):
            # The OS socket's: gevent's own shutdown() fails the waiting read with "closed in another
            # greenlet", which gunicorn logs with a traceback. Its handler's read now returns the end.
            with contextlib.suppress(OSError):
                sock._sock.shutdown(socket.SHUT_RDWR)
