"""`Client`: what a backend does with an API key (publish, publish in batches, introspect tokens)."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import Any

import httpx

from ._version import USER_AGENT
from .errors import ApiError, ProtocolError, ServiceUnreachable
from .models import BatchItem, Introspection, PublishedEvent


class Client:
    """A backend's connection to auth-rt, authenticated by an API key (`ak_...`).

    Every method raises `ApiError` when the service refuses (401 unknown or deleted key, 403 outside the
    key's scopes or channels, 413, 422, ...) and `ServiceUnreachable` when it cannot be reached. Nothing is
    retried by itself: a publish is not idempotent, so whether to try again is the caller's decision.
    """

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 10.0) -> None:
        """`base_url` is the service's origin, e.g. `https://rt.example.com`; `timeout` is in seconds."""
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT},
            timeout=timeout,
        )

    def publish(self, channel: str, event: str, data: Any = None) -> PublishedEvent:
        """Publish one event (`POST /events`) to a channel the key may publish to."""
        answer = self._json("POST", "/events", json={"channel": channel, "event": event, "data": data})
        if not isinstance(answer.get("id"), str) or not isinstance(answer.get("channel"), str):
            raise ProtocolError(f"unexpected publish answer: {answer!r:.200}")
        return PublishedEvent(id=answer["id"], channel=answer["channel"])

    def publish_batch(self, events: Iterable[BatchItem]) -> list[str]:
        """Publish 1 to 100 events in one atomic step (`POST /events/batch`): all are appended, or none.

        Returns the new events' ids, in order. Any invalid event, a channel the key may not publish to, or
        more than 100 events is an `ApiError` (422, 403, 413) and nothing is appended.
        """
        items = [{"channel": item["channel"], "event": item["event"], "data": item.get("data")} for item in events]
        answer = self._json("POST", "/events/batch", json={"events": items})
        ids = answer.get("ids")
        if not isinstance(ids, list):
            raise ProtocolError(f"unexpected batch answer: {answer!r:.200}")
        return ids

    def introspect(self, access_token: str) -> Introspection:
        """Check a user's access token by every rule the service applies (`POST /auth/introspect`, RFC 7662).

        Needs the `tokens:introspect` scope. A token that is expired, of an ended session, of an older
        token version, or not an access token at all answers `Introspection(active=False)`.
        """
        return Introspection.from_json(self._json("POST", "/auth/introspect", data={"token": access_token}))

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ServiceUnreachable(f"{method} {path}: {error}") from error
        if response.is_error:
            raise ApiError.from_response(response)
        try:
            answer = response.json()
        except ValueError as error:
            raise ProtocolError(f"{method} {path}: the answer is not JSON") from error
        if not isinstance(answer, dict):
            raise ProtocolError(f"{method} {path}: unexpected answer {answer!r:.200}")
        return answer
