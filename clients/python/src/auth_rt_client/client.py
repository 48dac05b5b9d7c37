"""`Client`: what a backend does with an API key (publish, publish in batches, introspect tokens, and manage
channels: namespaces, members and presence), and sessions for the application's own users by token exchange."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import httpx

from ._version import USER_AGENT
from .errors import ApiError, ProtocolError, ServiceUnreachable
from .models import BatchItem, Introspection, Member, Namespace, Presence, PublishedEvent, Tokens

SubscribeRule = Literal["members", "authenticated", "proxy"]
PublishRule = Literal["server", "subscribers"]
# RFC 8693 names (URNs, not secrets).
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105
TOKEN_TYPE_PREFIX = "urn:ietf:params:oauth:token-type:"  # noqa: S105


class Client:
    """A backend's connection to auth-rt, authenticated by an API key (`ak_...`).

    Every method raises `ApiError` when the service refuses (401 unknown or deleted key, 403 outside the
    key's scopes or channels, 413, 422, ...) and `ServiceUnreachable` when it cannot be reached. Nothing is
    retried by itself: a publish is not idempotent, so whether to try again is the caller's decision.

    Managing channels (namespaces, members, presence) needs the `channels:manage` scope; an admin's access
    token, given as `api_key`, may do it too. `exchange` needs no key: a client without one may only exchange.
    """

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout: float = 10.0) -> None:
        """`base_url` is the service's origin, e.g. `https://rt.example.com`; `timeout` is in seconds."""
        headers = {"User-Agent": USER_AGENT}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def exchange(
        self,
        subject_token: str,
        subject_token_type: str = "jwt",  # noqa: S107 - a token type's name, not a secret
        *,
        device: str | None = None,
    ) -> Tokens:
        """A session for one of the application's own users (`POST /oauth/token`, RFC 8693 token exchange).

        `subject_token` is a token of a trusted issuer (`PUT /admin/issuers/{name}`): the application's identity
        provider's ID token or access token, or a JWT its backend signs. `subject_token_type` is `jwt`,
        `id_token` or `access_token` (or the full `urn:ietf:params:oauth:token-type:` name). The service opens
        an ordinary session for the user the issuer and the token's `sub` name (made at the first exchange);
        `device` names it in the user's device list. Every exchange opens a new session: exchange again for
        a fresh one rather than keeping many. The API key is not sent (the token is the credential).

        Raises `ApiError` 400 with code `invalid_grant` for a token that is not accepted (signature, issuer,
        audience, expiry, an unknown issuer; the message says which), `invalid_request` for an unknown
        `subject_token_type`, 429 `rate_limited` (as logins are, per client address).
        """
        token_type = (
            subject_token_type if subject_token_type.startswith("urn:") else TOKEN_TYPE_PREFIX + subject_token_type
        )
        form = {
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": subject_token,
            "subject_token_type": token_type,
            "transport": "body",
        }
        if device is not None:
            form["device"] = device
        request = self._http.build_request("POST", "/oauth/token", data=form)
        request.headers.pop("Authorization", None)
        return Tokens.from_json(self._json_of(self._send(request)))

    def publish(self, channel: str, event: str, data: Any = None) -> PublishedEvent:
        """Publish one event (`POST /events`) to a channel the key may publish to.

        Named channels (`<namespace>:<name>`) are covered by a key's channels exactly, by `<namespace>:*`
        or by `*`; a namespace that does not exist is 404. The event carries no `from` (no user sent it).
        """
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

    def put_namespace(
        self,
        name: str,
        *,
        subscribe: SubscribeRule = "members",
        publish: PublishRule = "server",
        presence: bool = False,
        join_leave: bool = False,
        proxy_url: str | None = None,
        rotate_proxy_secret: bool = False,
    ) -> Namespace:
        """Create or replace a namespace (`PUT /admin/namespaces/{name}`).

        Open subscriptions to its channels follow the new rules at once. 422 for a name outside 1-32 of
        `a-z0-9_-`, a reserved one (`user`, `broadcast`, `webhooks`, `admin`), or `join_leave` without
        `presence`.

        `subscribe="proxy"` needs `proxy_url`, the application's endpoint the service asks (by a signed `POST`)
        whether a user without a grant may subscribe; it follows the outgoing webhooks' address rules (422
        otherwise). The answer's `proxy_secret` signs those requests: it is there only when this call made
        it (the namespace became a proxy one, or `rotate_proxy_secret=True` replaced it), never again.
        """
        body: dict[str, Any] = {
            "subscribe": subscribe,
            "publish": publish,
            "presence": presence,
            "join_leave": join_leave,
        }
        if proxy_url is not None:
            body["proxy_url"] = proxy_url
        if rotate_proxy_secret:
            body["rotate_proxy_secret"] = True
        return Namespace.from_json(self._json("PUT", f"/admin/namespaces/{_segment(name)}", json=body))

    def namespaces(self) -> list[Namespace]:
        """Every namespace (`GET /admin/namespaces`)."""
        answer = self._json("GET", "/admin/namespaces")
        found = answer.get("namespaces")
        if not isinstance(found, list):
            raise ProtocolError(f"unexpected namespaces answer: {answer!r:.200}")
        return [Namespace.from_json(namespace) for namespace in found]

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (`DELETE /admin/namespaces/{name}`).

        Open subscriptions to its channels end as if revoked, and its channels are 404 from then on.
        """
        self._call("DELETE", f"/admin/namespaces/{_segment(name)}")

    def grant(
        self, channel: str, user_id: str, *, info: Mapping[str, Any] | None = None, expires_in: float | None = None
    ) -> None:
        """Let one user subscribe to one channel, or change its grant (`PUT /channels/{channel}/members/{user}`).

        `info` (a JSON object of at most 1 KiB) shows in presence and join events; `expires_in` (seconds)
        ends the grant by itself. 404 for an unknown user or a namespace that does not exist.
        """
        body: dict[str, Any] = {}
        if info is not None:
            body["info"] = dict(info)
        if expires_in is not None:
            body["expires_in"] = expires_in
        self._call("PUT", f"{_channel_path(channel)}/members/{_segment(user_id)}", json=body)

    def revoke(self, channel: str, user_id: str) -> None:
        """End a user's grant of a channel (`DELETE /channels/{channel}/members/{user_id}`).

        The user's open connections stop receiving the channel within a second. No error when there was
        no grant.
        """
        self._call("DELETE", f"{_channel_path(channel)}/members/{_segment(user_id)}")

    def members(self, channel: str) -> list[Member]:
        """The users granted a channel (`GET /channels/{channel}/members`)."""
        answer = self._json("GET", f"{_channel_path(channel)}/members")
        found = answer.get("members")
        if not isinstance(found, list):
            raise ProtocolError(f"unexpected members answer: {answer!r:.200}")
        return [Member.from_json(member) for member in found]

    def presence(self, channel: str) -> Presence:
        """Who is in a channel now (`GET /channels/{channel}/presence`).

        Present are the users with at least one SSE or WebSocket connection reading it. 404 when its
        namespace does not exist or keeps no presence.
        """
        return Presence.from_json(self._json("GET", f"{_channel_path(channel)}/presence"))

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._send(self._http.build_request(method, path, **kwargs))

    def _send(self, request: httpx.Request) -> httpx.Response:
        try:
            response = self._http.send(request)
        except httpx.TransportError as error:
            raise ServiceUnreachable(f"{request.method} {request.url.path}: {error}") from error
        if response.is_error:
            raise ApiError.from_response(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        return self._json_of(self._call(method, path, **kwargs))

    @staticmethod
    def _json_of(response: httpx.Response) -> dict[str, Any]:
        where = f"{response.request.method} {response.request.url.path}"
        try:
            answer = response.json()
        except ValueError as error:
            raise ProtocolError(f"{where}: the answer is not JSON") from error
        if not isinstance(answer, dict):
            raise ProtocolError(f"{where}: unexpected answer {answer!r:.200}")
        return answer


def _segment(value: str) -> str:
    """One path segment: every character outside the unreserved set escaped (`/` too)."""
    return quote(value, safe="")


def _channel_path(channel: str) -> str:
    return f"/channels/{_segment(channel)}"
