"""Opening server-sent event streams without Flask's request machinery.

After a deploy or a network blip every client reconnects at once: thousands of `GET /events/stream`, and
each paid for Flask's request context, URL routing, before- and after-request hooks and response conversion,
about a quarter of what opening a stream cost the worker. The opener, a WSGI middleware in front of Flask,
opens the streams it can itself: a GET of /events/stream with a user's access token (or a client's, with scope
`events`, for its user). It answers them as the view would (the same headers, access line and metrics) and
streams the view's own body (`sse.stream_body`).

A stream is opened on its token's claims: subscribed first, and its session checked, with the stored user
read, in the opening's one round trip (`Follower`), not in a round trip of its own before. A session that
ended, a stored role other than the token's, and every other case that is not plain are opened again the
verified way, as every request is. A stream of named channels (`?channels=`) is opened the verified way from
the start: its session is checked before any channel's access is read, as the view does (a proxy namespace's
backend is asked only about a user whose session is in force).

Everything else goes to Flask. A refusal the opener meets on the way (a 401, a malformed cursor, 429) is
handed to the view, which raises it again (`answers_what_the_opener_refused`): every error has one answer.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from urllib.parse import parse_qsl

from flask import Flask, g
from werkzeug.datastructures import MultiDict
from werkzeug.http import parse_cookie
from werkzeug.wsgi import get_host

from ..auth import tokens
from ..auth.cookies import ACCESS_COOKIE
from ..auth.guards import API_KEY_PREFIX, Caller, cors_headers, verified_caller_reading
from ..channels.namespaces import namespaces_named, read_namespaces
from ..errors import REDIS_UNAVAILABLE
from ..http import validated_args
from ..logs import request_id_from, write_access_line
from ..page import SECURITY_HEADERS
from .schemas import StreamPosition
from .sse import STREAM_CONTENT_TYPE, STREAM_HEADERS, stream_body
from .views import REFUSED, follower_for_request, requested_channels

PATH = "/events/stream"
ENDPOINT = "events.stream"


class StreamOpener:
    """WSGI middleware: opens the event streams it can without Flask (see the module's text)."""

    def __init__(self, app: Flask, wsgi_app):
        self.app = app
        self.wsgi_app = wsgi_app

    def __call__(self, environ, start_response):
        """The stream, opened here; or Flask's answer, for anything else and every refusal."""
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") != "GET":
            return self.wsgi_app(environ, start_response)
        started = time.perf_counter()
        with self.app.app_context():
            opened = self._open(environ)
            cors = cors_headers(environ.get("HTTP_ORIGIN")) if opened is not None else []
        if opened is None:
            return self.wsgi_app(environ, start_response)
        caller, follower = opened
        body = stream_body(follower, environ, self.app.config["SETTINGS"], self.app.extensions["parked_streams"])
        request_id = request_id_from(environ.get("HTTP_X_REQUEST_ID", ""))
        host, scheme = get_host(environ), environ["wsgi.url_scheme"]
        access_line = functools.partial(
            write_access_line, "GET", PATH, ENDPOINT, 200, started, request_id, caller.user_id,
            environ.get("REMOTE_ADDR"), scheme, host,
        )  # fmt: skip
        body.response = ClosingCallbacks([follower.close, access_line])
        headers = [("Content-Type", STREAM_CONTENT_TYPE), *STREAM_HEADERS, ("X-Request-ID", request_id)]
        start_response("200 OK", [*headers, *cors, ("Vary", "Origin"), *SECURITY_HEADERS])
        return body

    def _open(self, environ) -> tuple | None:
        """(caller, follower) of a stream opened here; None for Flask to answer (with what was refused, if any)."""
        query = environ.get("QUERY_STRING", "")
        if not query.isascii():
            return None  # Flask decodes the odd query (and refuses it)
        args = MultiDict(parse_qsl(query, keep_blank_values=True))
        token, via = request_token(environ)
        if token is None or token.startswith(API_KEY_PREFIX):
            return None
        self.app.extensions["presence"].start_in_request()
        if "channels" in args:  # the session verified first, as the view does, before any channel's access is read
            return self._open_verified(environ, token, via, args)
        try:
            return self._open_on_claims(environ, token, via, args)
        except REDIS_UNAVAILABLE as error:  # the verified way would wait for Redis as long again: 503 now
            environ[REFUSED] = (None, error)
            return None
        except Exception:  # noqa: BLE001 - anything but the plain case is opened (or refused) the verified way
            return self._open_verified(environ, token, via, args)

    @staticmethod
    def _open_on_claims(environ, token: str, via: str, args: MultiDict) -> tuple:
        """The plain case in one round trip after the subscription: subscribed as the token's claims say, with
        the session checked (and the stored user read) in the opening. Raises for anything else, the session
        ended or the stored role no longer the token's included (the follower ends as for a role change: the
        stored role decides the channels read), and holds nothing then."""
        claims = tokens.decode_access_token(token)
        caller = g.caller = Caller(
            claims.user_id, claims.role, claims.session_id, claims.token_version, claims.expires_at, via, {}
        )
        follower = _follower(environ, args)
        follower.caller = g.caller = dataclasses.replace(caller, user=follower.user)
        return follower.caller, follower

    def _open_verified(self, environ, token: str, via: str, args: MultiDict) -> tuple | None:
        """Verified as every request is (the guard's `verified_caller`), then opened; None for the view to
        answer the refusal met on the way. The named channels' namespaces are read in the session check's round
        trip (where round trips are shared): the session is still judged first, and a proxy namespace's backend
        asked only about a user whose session is in force."""
        caller = None
        try:
            names = self._namespaces_of(args.get("channels", ""))
            reads = [read_namespaces(names)] if names else []
            caller, answers = verified_caller_reading(token, via, reads, client_tokens=True)  # a client's token too
            g.caller = caller
            read = dict(zip(names, answers[0], strict=True)) if answers and isinstance(answers[0], list) else None
            return caller, _follower(environ, args, read)
        except Exception as error:  # noqa: BLE001 - the view raises it again, where its error handlers answer it
            environ[REFUSED] = (caller, error)
            return None

    def _namespaces_of(self, channels: str) -> list[str]:
        """The namespaces the well-formed named channels of a `?channels=` list name (none past the cap on named
        channels, which the view refuses anyway)."""
        names = channels.split(",")
        if len(names) > self.app.config["SETTINGS"].max_channels_per_connection:
            return []
        return sorted(namespaces_named(names))


def request_token(environ) -> tuple[str | None, str]:
    """The access token (or API key) a request carries, and how: a bearer token first, else the access cookie."""
    header = environ.get("HTTP_AUTHORIZATION")
    if header is not None:
        scheme, _, value = header.partition(" ")
        return (value.strip() or None, "bearer") if scheme.lower() == "bearer" else (None, "bearer")
    cookie = environ.get("HTTP_COOKIE")
    return (parse_cookie(cookie).get(ACCESS_COOKIE) or None, "cookie") if cookie else (None, "cookie")


def _follower(environ, args: MultiDict, namespaces_read: dict | None = None):
    """The caller's follower from the query, read with the view's model (a bad ?cursor= is refused also beside
    a Last-Event-ID), the Last-Event-ID a reconnecting browser sends, and the named channels, checked as the
    view checks them (with the namespaces' stored texts read already, if given)."""
    asked = validated_args(StreamPosition, args)
    cursor = environ.get("HTTP_LAST_EVENT_ID") or asked.cursor or None
    named = requested_channels(asked.channels, namespaces_read)
    return follower_for_request(live=True, cursor=cursor, named=named, present=True)


class ClosingCallbacks:
    """What closing an opened stream runs (the view's response keeps the same list: `StreamBody.close`)."""

    __slots__ = ("callbacks",)

    def __init__(self, callbacks: list):
        self.callbacks = callbacks

    def take_close_callbacks(self) -> list:
        """The callbacks, for whoever ends the stream later (a parked stream)."""
        callbacks, self.callbacks = self.callbacks, []
        return callbacks

    def close(self) -> None:
        """Run each callback once."""
        for callback in self.take_close_callbacks():
            callback()
