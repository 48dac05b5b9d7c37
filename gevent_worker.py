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

Referenced by name from gunicorn.conf.py (`worker_class`). It lives outside the `app` package because
the arbiter imports the worker class, and importing `app` there would import the whole app early. The
hub's fan-out takes its turns the same way (app/events/links.py, `next_turn`).
"""

from __future__ import annotations

import contextlib
import socket
import weakref

import gevent
import gunicorn.http.wsgi
from gunicorn.workers.ggevent import GeventWorker


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


class FairGeventWorker(GeventWorker):
    """The gevent worker, with a turn of the event loop between two requests of one connection, whose responses
    send their head with their body (HeadWithBody)."""

    def init_process(self):
        """In the worker only (the arbiter imports this class too): gunicorn's HTTP/1 responses are HeadWithBody."""
        gunicorn.http.wsgi.Response = HeadWithBody
        self.idle_connections = weakref.WeakSet()  # waiting for their first or next request
        super().init_process()

    def handle(self, listener, client, addr):
        """Serve a connection; until its first request it is idle."""
        self.idle_connections.add(client)
        super().handle(listener, client, addr)

    def handle_request(self, listener_name, req, sock, addr):
        """Serve one request; if the connection stays open, let the loop run once before the next.

        A response that closes the connection (Connection: close, a stream handed over, a worker
        shutting down) raises StopIteration out of here, and so skips the wait.
        """
        self.idle_connections.discard(sock)
        super().handle_request(listener_name, req, sock, addr)
        # A 0 s timer rather than gevent.sleep(0): sleep(0) resumes from the loop's callbacks, which
        # run before it polls for I/O, so a greenlet that always sleeps 0 still keeps sockets waiting.
        # The timer fires after the next poll: other ready connections and new ones come first.
        hub = gevent.get_hub()
        with hub.loop.timer(0) as turn:
            hub.wait(turn)
        self.idle_connections.add(sock)

    def close_idle_connections(self) -> None:
        """Stopping: close the keep-alive connections that wait for a request, as nginx does. Left open, each
        held the stop for the whole graceful time-out, and was then killed with a traceback in the log.
        A connection serving a request is closed by gunicorn when its response is done."""
        for sock in list(self.idle_connections):
            # The OS socket's: gevent's own shutdown() fails the waiting read with "closed in another
            # greenlet", which gunicorn logs with a traceback. Its handler's read now returns the end.
            with contextlib.suppress(OSError):
                sock._sock.shutdown(socket.SHUT_RDWR)
