"""One JSON line per request on stdout, with a request id taken from X-Request-ID or made here.

Its fields ts, level, logger and msg are those of every other line under gunicorn (gunicorn.conf.py).

Only the path is logged (no query, headers or body), so tokens, cookies and passwords never appear.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import time
from json.encoder import encode_basestring_ascii as quoted

from flask import Flask, g, request

from .clock import utc_second
from .metrics import REQUEST_SECONDS

REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
access_log = logging.getLogger("access")


class AccessLineHandler(logging.StreamHandler):
    """The access log's own handler: each record's message on its line of stdout."""

    def __init__(self):
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("%(message)s"))


def _configure_access_log() -> None:
    if not access_log.handlers:
        access_log.addHandler(AccessLineHandler())
        access_log.setLevel(logging.INFO)
        access_log.propagate = False


def _write_line(line: str) -> None:
    """`line` written as `access_log.info` writes it, without a log record while the only handler is the service's
    own: making the record, its handler's lock and formatter were a third of an access line's cost. Lines are
    written from the workers' hub thread only, so no lock is missed. Any other handler attached (a test's
    capture, an operator's configuration) gets records as before."""
    handlers = access_log.handlers
    if len(handlers) == 1 and type(handlers[0]) is AccessLineHandler and access_log.isEnabledFor(logging.INFO):
        stream = handlers[0].stream
        stream.write(line + "\n")
        stream.flush()
    else:
        access_log.info(line)


def request_id_from(incoming: str) -> str:
    """The client's X-Request-ID when it is a plausible id, else a new one."""
    return incoming if REQUEST_ID.match(incoming) else new_request_id()


def new_request_id() -> str:
    """32 random hex digits (as uuid4's hex, without its version digits, at about a quarter of its cost)."""
    return os.urandom(16).hex()


@functools.lru_cache(maxsize=1024)
def _request_seconds(method: str, endpoint: str, status: int):
    """The request-duration histogram's child for these labels (made once: `labels` takes a lock and builds its
    key on every call)."""
    return REQUEST_SECONDS.labels(method, endpoint, str(status))


def write_access_line(method, path, endpoint, status, started, request_id, user_id, remote_addr, scheme, host) -> None:
    """A request's line, and its time in the request-duration metric (`started`: its perf_counter at start)."""
    duration = time.perf_counter() - started
    _request_seconds(method, endpoint or "unmatched", status).observe(duration)
    _write_line(access_line(utc_second() + "Z", method, path, status, round(duration * 1000, 2), request_id, user_id,
                            remote_addr, scheme, host))  # fmt: skip


def access_line(ts, method, path, status: int, duration_ms: float, request_id, user_id, remote_addr, scheme, host):
    """The access line's JSON, as `json.dumps` writes these fields in this order (a test holds them equal), in
    about a third of its time: each text is quoted by the encoder `json.dumps` uses."""
    return (
        f'{{"ts": {_text(ts)}, "level": "info", "logger": "access", "msg": "request", "method": {_text(method)}, '
        f'"path": {_text(path)}, "status": {int(status)}, "duration_ms": {float(duration_ms)!r}, '
        f'"request_id": {_text(request_id)}, "user_id": {_text(user_id)}, "remote_addr": {_text(remote_addr)}, '
        f'"scheme": {_text(scheme)}, "host": {_text(host)}}}'
    )


def _text(value: str | None) -> str:
    return "null" if value is None else quoted(value)


def init_app(app: Flask) -> None:
    """Log one JSON line per request (streams: when they end) and answer with its X-Request-ID."""
    _configure_access_log()

    @app.before_request
    def start_request():
        g.request_id = request_id_from(request.headers.get("X-Request-ID", ""))
        g.started = time.perf_counter()

    @app.after_request
    def finish_request(response):
        request_id = g.get("request_id") or new_request_id()
        response.headers["X-Request-ID"] = request_id
        caller = g.get("caller")
        fields = (
            request.method,
            request.path,
            request.endpoint,
            response.status_code,
            g.get("started", time.perf_counter()),
            request_id,
            caller.user_id if caller else None,
            request.remote_addr,
            request.scheme,
            request.host,
        )
        write_line = functools.partial(write_access_line, *fields)
        at_end = g.get("access_line_at_end")  # set by views whose response is never iterated (a WebSocket)
        if at_end is not None:
            at_end(write_line)
        else:
            response.call_on_close(write_line)  # streams: logged when they end
        return response
