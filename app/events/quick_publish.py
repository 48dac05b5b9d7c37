"""Publishing one event with an API key without Flask's request machinery.

Most backends publish one request per event. Each paid for Flask's request context, URL routing, before- and
after-request hooks and response conversion, and for two round trips before the publication itself (the key,
then the namespace): more than half of what a publication cost the worker. This WSGI middleware, in front of
Flask, publishes the plain case itself: `POST /events` with `Authorization: Bearer <API key>` and a JSON body
of known length that the view's model accepts, to a channel the key covers whose namespace exists. The key and
the namespace are read in one round trip (shared with other requests' reads arriving meanwhile), then the event
is published by the bus as the view publishes it, and answered as the view answers (the same status, body,
headers, access line and metrics). On one Redis a key verified here once is kept: its next publications are one
script, which publishes only while the key's record and the namespace exist (`Bus.publish_while_key`).

Anything else, and every refusal, goes to Flask, which decides again from the start: every error has one
answer. An error met while publishing (Redis unavailable, a replica that did not confirm) is handed to the view,
which raises it again (`answers_what_the_opener_refused`), because publishing again could publish twice.
"""

from __future__ import annotations

import io
import time
import weakref

from flask import Flask
from redis.exceptions import NoScriptError
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.wsgi import get_host

from quick_http import QUICK_ONLY

from ..apikeys.store import ApiKey, hash_key, key_of, verification_args, verification_command, verify_key_answer
from ..auth.guards import API_KEY_PREFIX, cors_headers
from ..channels.namespaces import RESERVED, split_channel
from ..http import _validate, parse_json
from ..logs import request_id_from, write_access_line
from ..page import SECURITY_HEADERS
from ..redis import Keys, is_cluster, shared_pipelines
from .opener import request_token
from .schemas import Publication
from .views import REFUSED

ROUTES = ((b"POST", b"/events"),)  # what the worker may ask for a quick answer (quick_http.py)
CREATED = f"201 {HTTP_STATUS_CODES[201].upper()}"  # as Werkzeug's response says it
PATH = "/events"
ENDPOINT = "events.publish"
SCOPE = "events:publish"
KNOWN_KEYS_KEPT = 1024  # publishing keys a worker keeps (all forgotten when more come)


def json_body(app: Flask, value) -> bytes:
    """`value` as the body of `app.json.response(value)`, without making the response."""
    json = app.json
    if (json.compact is None and app.debug) or json.compact is False:
        return f"{json.dumps(value, indent=2)}\n".encode()
    return f"{json.dumps(value, separators=(',', ':'))}\n".encode()


class QuickPublisher:
    """WSGI middleware: publishes the events it can without Flask (see the module's text)."""

    def __init__(self, app: Flask, wsgi_app):
        self.app = app
        self.wsgi_app = wsgi_app
        self.limit = app.config["MAX_CONTENT_LENGTH"]
        self._reads = None  # made with the first request: the Redis client is bound to the app after this
        self.failed_on = weakref.WeakKeyDictionary()  # a connection's socket: what its quick publication met
        self.known_keys: dict[str, ApiKey] = {}  # a publishing key's hash -> the key, once verified here

    def __call__(self, environ, start_response):
        """The publication's answer, made here; or Flask's, for anything else and every refusal. Asked by the worker
        for a quick answer only (`QUICK_ONLY`, quick_http.py), None instead of Flask's."""
        if self.failed_on:
            error = self.failed_on.pop(environ.get("gunicorn.socket"), None)
            if error is not None:  # this request, given back by the worker after its publication failed
                environ[REFUSED] = (None, error)
                return self.wsgi_app(environ, start_response)
        if environ.get("PATH_INFO") != PATH or environ.get("REQUEST_METHOD") != "POST":
            return self._elsewhere(environ, start_response)
        token, via = request_token(environ)
        key = token if via == "bearer" and token and token.startswith(API_KEY_PREFIX) else None
        body = self._body(environ) if key is not None else None  # read only what may be published here
        if body is None:
            return self._elsewhere(environ, start_response)
        started = time.perf_counter()
        with self.app.app_context():
            content = self._publish(environ, key, body)
            cors = cors_headers(environ.get("HTTP_ORIGIN")) if content is not None else []
        if content is None:
            return self._elsewhere(environ, start_response)
        request_id = request_id_from(environ.get("HTTP_X_REQUEST_ID", ""))
        start_response(
            CREATED,
            [
                ("Content-Type", self.app.json.mimetype),
                ("Content-Length", str(len(content))),
                ("Cache-Control", "no-store"),
                *SECURITY_HEADERS,
                *cors,
                ("Vary", "Origin"),
                ("X-Request-ID", request_id),
            ],
        )
        write_access_line(
            "POST", PATH, ENDPOINT, 201, started, request_id, None,
            environ.get("REMOTE_ADDR"), environ["wsgi.url_scheme"], get_host(environ),
        )  # fmt: skip
        return [content]

    def _elsewhere(self, environ, start_response):
        """Flask's answer; none for the worker's quick-only question (it gives the request to gunicorn)."""
        return None if QUICK_ONLY in environ else self.wsgi_app(environ, start_response)

    def _body(self, environ) -> bytes | None:
        """A JSON body of a given length within the limit, read (and put back for Flask); None otherwise."""
        mimetype = environ.get("CONTENT_TYPE", "").partition(";")[0].strip().lower()
        length = environ.get("CONTENT_LENGTH", "")
        if mimetype != "application/json" or not length.isdigit() or int(length) > self.limit:
            return None
        if environ.get("HTTP_TRANSFER_ENCODING"):
            return None
        body = environ["wsgi.input"].read(int(length))
        environ["wsgi.input"] = io.BytesIO(body)  # Flask reads it again if the request goes there
        return body if len(body) == int(length) else None

    def _publish(self, environ, raw_key: str, body: bytes) -> bytes | None:
        """The body of the view's 201 to a publication made here, or None for Flask to answer the request."""
        try:
            value = parse_json(body)
            publication = _validate(Publication, value) if isinstance(value, dict) else None
        except Exception:  # noqa: BLE001 - the view refuses it with its own words
            return None
        if publication is None:
            return None
        channel = publication.channel
        split = split_channel(channel)
        namespaced = split is not None and split[0] != "user"
        if namespaced and split[0] in RESERVED:
            return None
        namespace = split[0] if namespaced else None
        bus = self.app.extensions["event_bus"]
        key_hash = hash_key(raw_key)
        known = self.known_keys.get(key_hash) if bus.checks_keys else None
        if known is None:
            key = self._verified(raw_key, namespace)
            if key is None or SCOPE not in key.scopes or not key.may_publish(channel):
                return None
            if bus.checks_keys:
                self._know(key_hash, key)
        elif not known.may_publish(channel):
            return None
        self.app.extensions["presence"].start_in_request()
        try:
            event, data = publication.event, publication.data
            if known is None:
                published = bus.publish(channel, event, data)
            else:
                record, touch = Keys.api_key(key_hash), verification_args()
                published = bus.publish_while_key(channel, event, data, record, touch, namespace)
        except Exception as error:  # noqa: BLE001 - the view raises it again, where its error handlers answer it
            if QUICK_ONLY in environ:  # the worker gives the request to gunicorn, whose environ the view reads
                self.failed_on[environ["gunicorn.socket"]] = error
            else:
                environ[REFUSED] = (None, error)
            return None
        if published is None:  # the key or the namespace is gone: the view says which
            self.known_keys.pop(key_hash, None)
            return None
        return json_body(self.app, {"id": published.id, "channel": published.channel})

    def _verified(self, raw_key: str, namespace: str | None):
        """The key, read from Redis, if it exists and (given a namespace) the namespace does; None otherwise."""
        try:
            answers = self._read(raw_key, namespace)
        except Exception:  # noqa: BLE001 - Redis unavailable: the view waits for it and answers as it does
            return None
        if isinstance(answers[0], NoScriptError):  # not loaded yet, or Redis restarted: the direct call loads it
            answers[0] = self._verify_directly(raw_key)
        if any(isinstance(answer, Exception) for answer in answers):
            return None  # an error the view meets too, and answers
        if namespace is not None and answers[1] is None:
            return None  # 404
        return key_of(answers[0])

    def _know(self, key_hash: str, key) -> None:
        """Keep a publishing key's scopes and channels (they never change; that the key still exists is asked
        in the publication's own step): a key's verification was a round trip of its own before each publication."""
        if len(self.known_keys) >= KNOWN_KEYS_KEPT:
            self.known_keys.clear()
        self.known_keys[key_hash] = key

    @staticmethod
    def _verify_directly(raw_key: str):
        try:
            return verify_key_answer(raw_key)
        except Exception as error:  # noqa: BLE001 - answered by the view, which meets it too
            return error

    def _read(self, raw_key: str, namespace: str | None) -> list:
        """The key's verification and (given a namespace) the namespace's stored rules: one round trip, shared
        with other requests' reads arriving meanwhile; on a cluster, whose pipelines take no scripts, two."""
        client = self.app.extensions["redis"]
        if is_cluster(client):
            answers = [verify_key_answer(raw_key)]
            return answers + [client.hget(Keys.namespaces(), namespace)] if namespace is not None else answers
        if self._reads is None:
            self._reads = shared_pipelines(client)
        commands = [verification_command(raw_key)]
        if namespace is not None:
            commands.append(("hget", (Keys.namespaces(), namespace), {}))
        return self._reads(commands)
