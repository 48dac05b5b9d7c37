"""`Client`: what a backend does with an API key (publish, publish in batches, introspect tokens, and manage
channels: namespaces, members and presence), sessions for the application's own users by token exchange, and a
script's own session (log in with a password, renewed before it expires, log out)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Literal
from urllib.parse import quote

import httpx

from ._http import http_client
from .errors import ApiError, MfaRequired, ProtocolError, ServiceUnreachable
from .models import BatchItem, Introspection, Member, Namespace, Presence, PublishedEvent, Tokens, User
from .session import SessionTokens

SubscribeRule = Literal["members", "authenticated", "proxy"]
PublishRule = Literal["server", "subscribers"]
# RFC 8693 names (URNs, not secrets).
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105
TOKEN_TYPE_PREFIX = "urn:ietf:params:oauth:token-type:"  # noqa: S105
# Failures before any byte of the request was sent: no connection was made (refused, DNS, connect time-out, TLS
# handshake, a proxy refusing the tunnel), none was free in the pool, or the URL's scheme is not HTTP.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ProxyError, httpx.UnsupportedProtocol)


class Client:
    """A connection to auth-rt, authenticated by an API key (`ak_...`), by a session of its own, or both.

    Every method raises `ApiError` when the service refuses (401 unknown or deleted key, 403 outside the
    key's scopes or channels, 413, 422, ...) and `ServiceUnreachable` when it cannot be reached (its
    `maybe_received` says whether the service may have got the request). Nothing is retried by itself (a
    publish is not idempotent, so whether to try again is the caller's decision), but for a call the service
    refused, unperformed, because the session's access token had expired.

    Managing channels (namespaces, members, presence) needs the `channels:manage` scope; an admin's access
    token, given as `api_key`, may do it too. `exchange` and `login` need no key.

    `login` (or `exchange`) gives the client a session: it holds the tokens, renews them by itself shortly
    before the access token expires (`refresh_before` seconds, or half its lifetime if that is less), and once
    more when the service answers 401 `token_expired`; one renewal at a time, however many threads call.
    Calls are authenticated by the API key when the client has one, else by the session's access token;
    `me` and `logout_all` always by the session. Neither tokens nor passwords show in `repr`.
    """

    def __init__(
        self, base_url: str, api_key: str | None = None, *, timeout: float = 10.0, refresh_before: float = 60.0
    ) -> None:
        """`base_url` is the service's origin, e.g. `https://rt.example.com`; `timeout` is in seconds."""
        self._api_key = api_key
        self._http = http_client(base_url=base_url.rstrip("/"), timeout=timeout)
        # Each renewal on a new connection: a kept-alive one the service closed while idle fails like an answer
        # lost after the service got the request, which would cost the session for nothing.
        self._renewals = http_client(timeout=timeout, limits=httpx.Limits(max_keepalive_connections=0))
        self._session = SessionTokens(self._refreshed, refresh_before)
        self._device_tokens: dict[str, str] = {}  # per account (lower-cased e-mail): sent back at its next login

    def __repr__(self) -> str:
        tokens = self._session.tokens
        session = f"user {tokens.user.id}, session {tokens.session_id}" if tokens else "no session"
        key = "an API key" if self._api_key is not None else "no API key"
        return f"<Client {self._http.base_url} with {key}, {session}>"

    @property
    def tokens(self) -> Tokens | None:
        """The session's current tokens (after `login`, `login_mfa` or `exchange`), or None without a session."""
        return self._session.tokens

    def access_token(self) -> str:
        """The session's access token, renewed first when it is about to expire; `LoginRequired` without a
        session. Give the method itself to `EventReader`, which asks for a token before every connection."""
        return self._session.access_token()

    def login(self, email: str, password: str, *, device: str | None = None, device_token: str | None = None) -> Tokens:
        """Log in with a password (`POST /auth/login`, tokens in the answer): the client's session from now on.

        `device` names the session in the user's device list (default: the client's User-Agent). `device_token`
        (from an earlier login's `Tokens`) says this device logged in to the account before, which keeps it
        apart from someone guessing the password; the client sends back the last one it got for the account
        by itself. A session the client held before is replaced, not ended (call `logout` first for that).

        Raises `ApiError` 401 `invalid_credentials` for a wrong password or an unknown address (alike), 403
        `email_not_verified` where addresses must be verified, 429 `rate_limited`; and `MfaRequired` (an
        `ApiError` 401 `mfa_required`) for an account with a second factor: finish with `login_mfa`.
        """
        body = {"email": email, "password": password, "transport": "body"}
        if device is not None:
            body["device"] = device
        known = device_token or self._device_tokens.get(email.lower())
        if known is not None:
            body["device_token"] = known
        return self._start_session(self._http.build_request("POST", "/auth/login", json=body))

    def login_mfa(
        self,
        mfa_token: str,
        *,
        code: str | None = None,
        recovery_code: str | None = None,
        device: str | None = None,
    ) -> Tokens:
        """Finish a login with a second factor (`POST /auth/login/mfa`): `MfaRequired.mfa_token` and either the
        authenticator app's `code` or one of the account's recovery codes.

        Raises `ApiError` 401 `invalid_mfa_code` for a wrong code (the same `mfa_token` may try again), 400
        `invalid_token` for a used or expired `mfa_token` (5 minutes: log in again), 429 `mfa_locked`.
        """
        if (code is None) == (recovery_code is None):
            raise ValueError("login_mfa takes a code or a recovery_code (one of them)")
        body = {"mfa_token": mfa_token, "transport": "body"}
        body.update({"code": code} if code is not None else {"recovery_code": recovery_code})
        if device is not None:
            body["device"] = device
        return self._start_session(self._http.build_request("POST", "/auth/login/mfa", json=body))

    def refresh(self) -> Tokens:
        """Renew the session now (`POST /auth/refresh`); the client does it by itself when needed.

        The refresh token is rotated: the new tokens replace the old, and the old refresh token is never
        presented again (the service would end the session). A refused renewal (401 `refresh_token_reused`
        or `invalid_refresh_token`: the session has ended) raises that `ApiError` and the client forgets the
        session; `LoginRequired` without a session, or for one that came without a refresh token.

        A renewal that failed otherwise keeps the refresh token, to present it at the next try, only when the
        service certainly did not rotate it: `ServiceUnreachable` with `maybe_received` False (the request never
        left: connection refused, DNS, connect time-out), or an `ApiError` 429 (or another 4xx). When the
        service may have rotated it without its answer arriving (a read time-out, a connection dropped or reset
        after sending, a 5xx, perhaps a proxy's after forwarding, an answer that is not the tokens), the client
        forgets the session and raises `LoginRequired` (the original failure is its `__cause__`): log in or
        exchange again. The session the service may still hold ends when its refresh token expires, or from
        the user's device list.
        """
        return self._session.renew()

    def me(self) -> User:
        """The user of the client's session (`GET /auth/me`); `LoginRequired` without a session."""
        answer = self._json_of(self._as_user(self._session.access_token(), "GET", "/auth/me"))
        return User.from_json(answer.get("user"))

    def logout(self) -> None:
        """End the client's session (`POST /auth/logout`): its tokens stop working at once, on every worker.

        No error without a session, or when the session had already ended; the tokens are kept (to try
        again) only when the service could not be asked.
        """
        self._session.end(self._end_session)

    def logout_all(self) -> None:
        """Log the user out of every device (`POST /auth/logout-all`): every session ends, this one too, and
        every live connection closes. `LoginRequired` without a session."""
        token = self._session.access_token()
        session_id = self._session.tokens.session_id if self._session.tokens else ""
        self._as_user(token, "POST", "/auth/logout-all")
        self._session.forget(session_id)

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
        `device` names it in the user's device list. Every exchange opens a new session, which becomes the
        client's (as after `login`: renewed by its refresh token, ended by `logout`). The API key is not sent
        (the token is the credential).

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
        return self._start_session(self._http.build_request("POST", "/oauth/token", data=form))

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
        """Close the connection pools."""
        self._http.close()
        self._renewals.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A call by the API key, or without one by the session's access token (or unauthenticated)."""
        if self._api_key is None and self._session.tokens is not None:
            return self._as_user(self._session.access_token(), method, path, **kwargs)
        return self._send(self._request(method, path, self._api_key, **kwargs))

    def _as_user(self, token: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A call with the session's access token; renewed and sent once more if the service says it expired."""
        response = self._answer(self._request(method, path, token, **kwargs))
        if response.status_code == 401 and ApiError.from_response(response).code == "token_expired":
            token = self._session.renew(refused=token).access_token
            response = self._answer(self._request(method, path, token, **kwargs))
        return _checked(response)

    def _request(self, method: str, path: str, bearer: str | None, **kwargs: Any) -> httpx.Request:
        request = self._http.build_request(method, path, **kwargs)
        if bearer is not None:
            request.headers["Authorization"] = f"Bearer {bearer}"
        return request

    def _send(self, request: httpx.Request) -> httpx.Response:
        return _checked(self._answer(request))

    def _answer(self, request: httpx.Request, http: httpx.Client | None = None) -> httpx.Response:
        try:
            return (http or self._http).send(request)
        except httpx.TransportError as error:
            where = f"{request.method} {request.url.path}"
            raise ServiceUnreachable(f"{where}: {error}", maybe_received=not isinstance(error, NOT_SENT)) from error

    def _start_session(self, request: httpx.Request) -> Tokens:
        """Send a login (of any kind) and keep the session it opens."""
        requested_at = self._session.now()
        response = self._answer(request)
        if response.status_code == 401 and ApiError.from_response(response).code == "mfa_required":
            raise _mfa_required(response)
        tokens = Tokens.from_json(self._json_of(_checked(response)))
        if tokens.device_token is not None and tokens.user.email is not None:
            self._device_tokens[tokens.user.email.lower()] = tokens.device_token
        self._session.hold(tokens, requested_at)
        return tokens

    def _refreshed(self, tokens: Tokens) -> Tokens:
        """The session's next tokens, for its refresh token (rotated: the old one is spent)."""
        request = self._request("POST", "/auth/refresh", None, json={"refresh_token": tokens.refresh_token})
        fresh = Tokens.from_json(self._json_of(_checked(self._answer(request, self._renewals))))
        if fresh.session_id != tokens.session_id:
            raise ProtocolError("a refresh answered another session's tokens")
        return fresh

    def _end_session(self, tokens: Tokens) -> None:
        """`POST /auth/logout` for the session: by its access token, or its refresh token once that expired."""
        body = {"refresh_token": tokens.refresh_token} if tokens.refresh_token is not None else None
        self._send(self._request("POST", "/auth/logout", tokens.access_token, json=body))

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


def _checked(response: httpx.Response) -> httpx.Response:
    if response.is_error:
        raise ApiError.from_response(response)
    return response


def _mfa_required(response: httpx.Response) -> MfaRequired:
    """The 401 `mfa_required` answer as the exception that carries its `mfa_token`."""
    try:
        mfa_token = response.json()["mfa_token"]
    except (ValueError, KeyError, TypeError) as error:
        raise ProtocolError("POST /auth/login answered mfa_required without an mfa_token") from error
    if not isinstance(mfa_token, str) or not mfa_token:
        raise ProtocolError("POST /auth/login answered mfa_required without an mfa_token")
    return MfaRequired(ApiError.from_response(response), mfa_token)


def _segment(value: str) -> str:
    """One path segment: every character outside the unreserved set escaped (`/` too)."""
    return quote(value, safe="")


def _channel_path(channel: str) -> str:
    return f"/channels/{_segment(channel)}"
