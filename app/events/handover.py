"""Taking a streaming response's connection from gunicorn's handler, so that no greenlet waits for it.

gunicorn's gevent worker serves each connection in a handler greenlet of a pool sized by
`worker_connections`. A response body that has written everything it has can end as if it were
complete while the connection stays open: it makes gunicorn's response unchunked and closing, so
gunicorn writes no terminating chunk and reads no next request, and it detaches the socket in the
body's close(), so gunicorn's own close of it closes nothing. The handler greenlet then ends, and
the hand-over keeps the connection's place in the pool (a pool tracks any object it is given: a
greenlet would cost a kilobyte more), so a full worker still stops accepting.
Where any of that is not there (another server, TLS, a test client) there is no hand-over.
"""

from __future__ import annotations

import gevent
import gevent.pool
import gevent.socket

from .outlet import plain_socket

SERVER_RESPONSE = "auth_rt.server_response"
HANDLER_POOLS: list[gevent.pool.Pool] = []


class HandlerPool(gevent.pool.Pool):
    """gunicorn's pool of connection handlers, findable from a request (gunicorn.conf.py installs it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        HANDLER_POOLS.append(self)


class KeepsServerResponse:
    """WSGI middleware: puts the server's response object in the environ, where gunicorn's is the
    owner of the `start_response` it passes."""

    def __init__(self, wsgi_app):
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        """The app's answer, with the server's response object in the environ."""
        environ[SERVER_RESPONSE] = getattr(start_response, "__self__", None)
        return self.wsgi_app(environ, start_response)


def is_gunicorn_response(response) -> bool:
    """Whether `response` is gunicorn's own (or the worker's subclass of it), with the attributes a hand-over sets."""
    gunicorns = any(cls.__module__ == "gunicorn.http.wsgi" for cls in type(response).__mro__)
    return gunicorns and hasattr(response, "chunked")


class Handover:
    """One response's way out of its handler; `possible()` says whether this request has one."""

    __slots__ = ("response", "sock", "pool")

    def __init__(self, response, sock, pool: gevent.pool.Pool):
        self.response = response
        self.sock = sock
        self.pool = pool

    @classmethod
    def possible(cls, environ) -> Handover | None:
        """A hand-over for an HTTP/1.x request on a plain socket of gunicorn's gevent worker, else None."""
        response = environ.get(SERVER_RESPONSE)
        sock = plain_socket(environ.get("gunicorn.socket"))
        if sock is None or not is_gunicorn_response(response):
            return None
        if environ.get("SERVER_PROTOCOL") not in ("HTTP/1.1", "HTTP/1.0"):
            return None
        current = gevent.getcurrent()
        pool = next((pool for pool in HANDLER_POOLS if current in pool), None)
        return None if pool is None else cls(response, sock, pool)

    def can_start(self) -> bool:
        """Whether this finds a place in the pool (the handler still holds its own until it ends)."""
        return self.pool.free_count() > 0

    def prepare(self) -> None:
        """Just before the body ends: gunicorn then ends the response writing nothing, and closes."""
        self.response.chunked = False
        self.response.force_close()

    def take(self) -> gevent.socket.socket:
        """From the body's close(): the connection's socket; this takes the handler's place in the pool."""
        self.pool.add(self, blocking=False)  # can_start() said there is room, and nothing ran since
        old = self.sock  # its family, type and protocol given spare the new socket three system calls
        sock = gevent.socket.socket(old.family, gevent.socket.SOCK_STREAM, old.proto, fileno=old.detach())
        self.response = self.sock = None
        return sock

    def release(self) -> None:
        """The connection is closed: its place in the pool is free (the worker may accept again)."""
        self.pool.discard(self)
