"""`EventReader`: follow a user's events over server-sent events or long polling, resuming by cursor;
named channels too, with notice of a channel whose access ended."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, Literal

import httpx

from ._http import http_client
from .errors import ApiError, ProtocolError, ServiceUnreachable
from .models import Event
from .sse import SSEParser, parse_lines, split_lines

Transport = Literal["sse", "long-poll"]
#: An access token, or a function returning a valid one; it is called before every (re)connection.
TokenSource = str | Callable[[], str]
#: Told of a channel the reader stopped following, and why: `revoked`, `expired`, `namespace_deleted` or
#: `access_changed`.
UnsubscribedCallback = Callable[[str, str], None]
# Answers that refuse one of the named channels (after the first connection: access ended meanwhile).
CHANNEL_REFUSALS = (403, 404)


class EventReader:
    """Every event of the channels a user may read (its own `user:<id>`, `broadcast`, ...), in order.

    Iterate over it to receive `Event`s. `cursor` names the position just after what was received so far:
    persist it, and a new reader given it later yields every later event exactly once. Without a cursor
    the reader fixes the present when iteration starts (no history), so a reconnection before the first
    event loses nothing either.

    A dropped connection, a worker shutting down, 429 (too many connections) and 5xx are retried with the
    same cursor, after the stream's `retry:` delay (or `Retry-After`), doubling on repeated failures up
    to `max_backoff` seconds. Any other refusal raises `ApiError`: 401 when the token has expired or its
    session has ended, 400 for a malformed cursor. Pass a function as `access_token` to hand out fresh
    tokens (a logged-in `Client`'s `access_token`): it is called before every connection, and once more after
    a 401 before that is raised; when it raises `ServiceUnreachable` or a retryable `ApiError` (429, 5xx),
    that is retried as a failed connection is. Anything else it raises ends the iteration: `LoginRequired`
    from a `Client` whose session has ended, or whose renewal's answer was lost (its refresh token may be
    spent, and asking again would present it again).

    With long polling the service returns a cursor per answer, not per event: within an answer of several
    events `cursor` moves when its last event is yielded, so resuming from a cursor persisted in the middle
    of one delivers its first events again (use `limit=1` for exactly one event per answer).

    `channels` adds named channels (`<namespace>:<name>`) to the user's own; they start at the present
    unless the cursor names them. A channel refused at the first connection raises `ApiError` (403, or 404
    for a namespace that does not exist). Later, when the user's access to one ends, the reader stops
    following it, tells `on_unsubscribed(channel, reason)`, and goes on with the rest: at once over SSE
    (the service's `unsubscribed` notice), and at the next request with long polling (the channel, asked
    for alone, is refused: reason `namespace_deleted` for a 404, `access_changed` for a 403).
    """

    def __init__(
        self,
        base_url: str,
        access_token: TokenSource,
        *,
        cursor: str | None = None,
        transport: Transport = "sse",
        wait_seconds: float = 25.0,
        limit: int | None = None,
        idle_timeout: float = 60.0,
        timeout: float = 10.0,
        max_backoff: float = 30.0,
        channels: Iterable[str] = (),
        on_unsubscribed: UnsubscribedCallback | None = None,
    ) -> None:
        """Read from `base_url` as the user of `access_token`.

        `wait_seconds` is how long one long poll is held; `limit` caps the events of one long-poll answer;
        `idle_timeout` is how long an SSE stream may stay silent (the service sends a heartbeat every 15 s
        by default) before it is taken for dead and reopened; `timeout` applies to connecting and to
        everything else.
        """
        if transport not in ("sse", "long-poll"):
            raise ValueError(f"transport must be 'sse' or 'long-poll', not {transport!r}")
        self._token = access_token
        self._cursor = cursor
        self._transport = transport
        self._wait_seconds = wait_seconds
        self._limit = limit
        self._idle_timeout = idle_timeout
        self._timeout = timeout
        self._max_backoff = max_backoff
        self._channels = list(dict.fromkeys(channels))
        self._on_unsubscribed = on_unsubscribed
        self._connected = False  # once a connection was accepted, a refused channel is dropped, not raised
        self._retry = 1.0  # seconds before reconnecting; the stream's `retry:` line replaces it
        self._failures = 0
        self._closed = threading.Event()
        self._started = False
        self._network_stream: Any = None
        self._http = http_client(base_url=base_url.rstrip("/"), timeout=timeout)

    @property
    def cursor(self) -> str | None:
        """The position after the last event yielded (None until iteration has fixed the present)."""
        return self._cursor

    @property
    def channels(self) -> tuple[str, ...]:
        """The named channels followed: those given, less any whose access has ended."""
        return tuple(self._channels)

    @property
    def closed(self) -> bool:
        """Whether `close()` was called."""
        return self._closed.is_set()

    def __iter__(self) -> Iterator[Event]:
        """Yield events until `close()` (one iteration per reader)."""
        if self._started:
            raise RuntimeError("an EventReader can be iterated once; make a new one with its cursor")
        self._started = True
        return self._follow()

    def close(self) -> None:
        """Stop reading, also from another thread: the iteration ends at once, without an error."""
        self._closed.set()
        stream = self._network_stream
        if stream is not None:
            # Closing a socket does not wake a thread blocked reading it; shutting it down does.
            with contextlib.suppress(OSError, AttributeError):
                stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        if not self._started:
            self._http.close()

    def __enter__(self) -> EventReader:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _follow(self) -> Iterator[Event]:
        try:
            if self._cursor is None:
                self._cursor = self._present()
            if self._cursor is not None:
                yield from self._follow_sse() if self._transport == "sse" else self._follow_long_poll()
        finally:
            self._http.close()

    def _present(self) -> str | None:
        """The cursor of the present: a poll without a cursor reads nothing and names where it stands."""
        response = self._connect("/events", {}, {}, self._timeout)
        if response is None:
            return None
        try:
            response.read()
        finally:
            response.close()
        cursor: str | None = response.headers.get("Event-Cursor")
        if not cursor:
            raise ProtocolError("GET /events answered without an Event-Cursor header")
        return cursor

    def _follow_sse(self) -> Iterator[Event]:
        while not self._closed.is_set():
            headers = {"Accept": "text/event-stream", "Last-Event-ID": self._cursor or ""}
            response = self._connect("/events/stream", {}, headers, self._idle_timeout)
            if response is None:
                return
            parser, delay = SSEParser(), self._retry
            try:
                content_type = response.headers.get("Content-Type", "")
                if response.status_code != 200 or not content_type.startswith("text/event-stream"):
                    raise ProtocolError(f"GET /events/stream answered {response.status_code} {content_type}")
                for message in parse_lines(split_lines(response.iter_bytes()), parser):
                    # The service's own notices carry no `id:` line; an event always does, whatever its name.
                    if message.id is None and message.event == "session_ended":
                        delay = 0.0  # reconnect at once: a fresh token goes on, an ended session is a 401
                        break
                    if message.id is None and message.event == "unsubscribed":
                        self._unsubscribed(message.data)
                        continue
                    event = self._event(message.data)
                    if message.id:
                        self._cursor = message.id
                    yield event
            except httpx.TransportError:
                if self._closed.is_set():
                    return
                self._failures += 1
                delay = self._backoff()
            finally:
                response.close()
                if parser.retry_ms is not None:
                    self._retry = parser.retry_ms / 1000
            self._closed.wait(delay)

    def _follow_long_poll(self) -> Iterator[Event]:
        while not self._closed.is_set():
            params = {"cursor": self._cursor or "", "timeout": f"{self._wait_seconds:g}"}
            if self._limit is not None:
                params["limit"] = str(self._limit)
            # The answer may take the whole wait: allow that plus the ordinary time-out.
            response = self._connect("/events/wait", params, {}, self._wait_seconds + self._timeout)
            if response is None:
                return
            try:
                body = response.read()
            except httpx.TransportError:
                if self._closed.is_set():
                    return
                self._failures += 1
                self._closed.wait(self._backoff())
                continue
            finally:
                response.close()
            if response.status_code == 204:
                self._cursor = response.headers.get("Event-Cursor") or self._cursor
                continue
            events, cursor = self._page(body)
            for number, event in enumerate(events, 1):
                if number == len(events):
                    self._cursor = cursor
                yield event

    def _connect(
        self, path: str, params: dict[str, str], headers: dict[str, str], read_timeout: float
    ) -> httpx.Response | None:
        """An open response (200 or 204), transient failures retried; None once closed."""
        asked_again = False
        while not self._closed.is_set():
            token = self._token_or_delay()
            if isinstance(token, float):
                self._closed.wait(token)
                continue
            query = {**params, "channels": ",".join(self._channels)} if self._channels else params
            request = self._http.build_request(
                "GET",
                path,
                params=query,
                headers={**headers, "Authorization": f"Bearer {token}"},
                timeout=httpx.Timeout(self._timeout, read=read_timeout),
                extensions={"trace": self._trace},
            )
            try:
                response = self._http.send(request, stream=True)
            except httpx.TransportError:
                if self._closed.is_set():
                    return None
                self._failures += 1
                delay = self._backoff()
            else:
                if response.status_code in (200, 204):
                    self._failures = 0
                    self._connected = True
                    return response
                try:
                    response.read()
                finally:
                    response.close()
                error = ApiError.from_response(response)
                if error.status == 401 and callable(self._token) and not asked_again:
                    asked_again = True  # the token function may have a fresh token: one more try with it
                    continue
                if error.status in CHANNEL_REFUSALS and self._connected and self._channels:
                    try:
                        if self._drop_refused_channels():
                            continue  # at once, with the channels that remain
                    except httpx.TransportError:
                        pass
                if not error.retryable:
                    raise error
                self._failures += 1
                delay = max(self._backoff(), error.retry_after or 0.0)
            self._closed.wait(delay)
        return None

    def _drop_refused_channels(self) -> bool:
        """Ask for each named channel alone (a poll without a cursor reads nothing); stop following the
        refused ones and say so. Whether any was dropped."""
        dropped = False
        for channel in list(self._channels):
            answer = self._http.get(
                "/events", params={"channels": channel}, headers={"Authorization": f"Bearer {self._access_token()}"}
            )
            if answer.status_code in CHANNEL_REFUSALS:
                dropped = True
                self._drop(channel, "namespace_deleted" if answer.status_code == 404 else "access_changed")
        return dropped

    def _unsubscribed(self, data: str) -> None:
        try:
            notice = json.loads(data)
            channel, reason = notice["channel"], notice["reason"]
        except (ValueError, KeyError, TypeError) as error:
            raise ProtocolError(f"an unsubscribed notice that is not one: {data!r:.200}") from error
        self._drop(channel, reason)

    def _drop(self, channel: str, reason: str) -> None:
        if channel not in self._channels:
            return
        self._channels.remove(channel)
        if self._on_unsubscribed is not None:
            self._on_unsubscribed(channel, reason)

    def _trace(self, name: str, info: dict[str, Any]) -> None:
        # The reader uses one connection at a time, so the newest one opened is the one in use.
        if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            self._network_stream = info.get("return_value")

    def _access_token(self) -> str:
        return self._token() if callable(self._token) else self._token

    def _token_or_delay(self) -> str | float:
        """A token for the next connection, or the seconds to wait when the token function met a transient
        failure (no answer, 429, 5xx): that is retried as a failed connection is. Anything else, such as a
        `Client`'s `LoginRequired`, ends the iteration."""
        try:
            return self._access_token()
        except ServiceUnreachable:
            retry_after = 0.0
        except ApiError as error:
            if not error.retryable:
                raise
            retry_after = error.retry_after or 0.0
        self._failures += 1
        return max(self._backoff(), retry_after)

    def _backoff(self) -> float:
        return min(self._max_backoff, self._retry * 2.0 ** max(0, self._failures - 1))

    @staticmethod
    def _event(data: str) -> Event:
        try:
            return Event.from_json(json.loads(data))
        except ValueError as error:
            raise ProtocolError(f"an SSE message's data is not JSON: {data!r:.200}") from error

    @staticmethod
    def _page(body: bytes) -> tuple[list[Event], str]:
        try:
            answer = json.loads(body)
            events, cursor = answer["events"], answer["cursor"]
        except (ValueError, KeyError, TypeError) as error:
            raise ProtocolError(f"unexpected long-poll answer: {body!r:.200}") from error
        if not isinstance(events, list) or not isinstance(cursor, str):
            raise ProtocolError(f"unexpected long-poll answer: {body!r:.200}")
        return [Event.from_json(event) for event in events], cursor
