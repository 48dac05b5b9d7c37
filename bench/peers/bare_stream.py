"""A bare event stream: what opening a stream costs on this project's gunicorn with nothing of the service in
it (the headers and one comment line, then the connection held until the client leaves)."""

import gevent

HEADERS = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")]


def app(environ, start_response):
    start_response("200 OK", HEADERS)
    return _held()


def _held():
    yield b": stream open\n\n"
    while True:
        gevent.sleep(3600)  # the worker's stop ends it
