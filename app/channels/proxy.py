"""The subscribe proxy: the application's backend decides who reads the channels of a `subscribe: proxy` namespace.

When a user without a grant in force subscribes to such a channel (`?channels=` or a WebSocket frame), the
service POSTs `{"user_id", "external"?, "channel"}` to the namespace's `proxy_url`, signed with the Standard
Webhooks headers under the namespace's secret, over the address-checked HTTP of outgoing webhooks. A 200
`{"allow": true, "info"?, "expires_in"?}` within SUBSCRIBE_PROXY_TIMEOUT_SECONDS becomes an ordinary grant
(`expires_in` default SUBSCRIBE_PROXY_GRANT_SECONDS), and the subscription goes on; `{"allow": false}` or any
other answer is 403; no answer in time, or no connection, is 503.

The asking runs in the subscribing connection's own greenlet (the channels of one request each in a greenlet
of its own, so a request waits one time-out at most), before anything is held. Nothing is shared with other
requests but the kept connections, taken without waiting: no lock and no queue, so a slow backend delays
only the connections that wait for its own answer. The hub's re-checks read grants only and never ask.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, replace

import gevent
from flask import Flask, current_app, has_app_context

from .. import audit
from ..errors import ApiError, forbidden, validation_failed
from ..http import StrictJSONError, parse_json
from ..outgoing.sender import Sender
from ..outgoing.signing import new_secret, signature_headers
from ..outgoing.ssrf import TargetRefused, check_url
from ..redis import Keys, get_redis
from . import grants, manage
from .namespaces import Namespace, get_namespace, validate_namespace

log = logging.getLogger(__name__)

PURPOSE = "subscribe proxy of namespace"  # what the log calls a request's key (the namespace's name)
POOL_SIZE = 10  # kept connections per address of a namespace's proxy; more at once are made, then closed
READ_LIMIT = 8 * 1024  # of the backend's answer: its info is at most 1 KiB
RESOLVE_TIMEOUT = 5.0  # for checking a proxy_url when it is saved
UNAVAILABLE_NO_CONNECTION = ("timeout", "refused", "connection_error")  # the Sender's kinds of "no answer"


@dataclass(frozen=True)
class Verdict:
    """What the backend said about one channel: allowed (with the grant's terms), refused, or nothing usable."""

    outcome: str  # "allowed" | "forbidden" | "unavailable"
    info: dict | None = None
    expires_in: float | None = None


def unavailable(message: str) -> ApiError:
    """503: the backend that decides did not answer in time, or could not be reached."""
    return ApiError(503, "unavailable", message, {"Retry-After": "1"})


def checked_proxy_url(url: str, settings) -> str:
    """422 unless outgoing webhooks could be sent to the URL (https, public addresses, unless the settings allow)."""
    try:
        with gevent.Timeout(RESOLVE_TIMEOUT, TargetRefused("The URL's host could not be resolved in time.")):
            check_url(url, settings.allow_http, settings.allow_private)
    except TargetRefused as refusal:
        raise validation_failed(f"proxy_url: {refusal}") from None
    return url


def define(namespace: Namespace) -> dict:
    """Create or replace a namespace as `PUT /admin/namespaces/{ns}` and the CLI do: `N`, with `proxy_secret`
    when this write made a new one (a proxy namespace made now, or rotated; every other write keeps it).
    422 for bad rules, or a proxy_url outgoing webhooks could not be sent to."""
    validate_namespace(namespace)
    if namespace.subscribe == "proxy":
        checked_proxy_url(namespace.proxy_url, current_app.config["SETTINGS"].outgoing_webhooks)
    candidate = new_secret() if namespace.subscribe == "proxy" else None
    defined = manage.define_namespace(replace(namespace, proxy_secret=candidate))
    answer = defined.answer()
    if candidate is not None:
        stored = get_namespace(get_redis(), namespace.name)
        if stored is not None and stored.proxy_secret == candidate:  # else the stored secret was kept
            answer["proxy_secret"] = candidate
    return answer


def subscribe_proxy(app: Flask | None = None) -> SubscribeProxy:
    """The app's proxy asker (one per process: its kept connections are shared by every request)."""
    app = app if app is not None else current_app._get_current_object()
    found = app.extensions.get("subscribe_proxy")
    if found is None:
        found = app.extensions["subscribe_proxy"] = SubscribeProxy(app)
    return found


class SubscribeProxy:
    """Asks a namespace's backend whether a user may read a channel, and grants what it allows."""

    def __init__(self, app: Flask):
        settings = app.config["SETTINGS"]
        self.app = app
        self.timeout = settings.subscribe_proxy_timeout
        self.grant_seconds = min(settings.subscribe_proxy_grant_seconds, grants.EXPIRES_IN_LIMIT)
        self.sender = Sender(settings.outgoing_webhooks, POOL_SIZE, purpose=PURPOSE)

    def admit(self, client, user_id: str, asked: dict[str, Namespace]) -> None:
        """Ask about each channel (all at once), grant the allowed ones; then 403 if any was refused, 503 if
        any had no answer."""
        external = self._external(client, user_id)
        if len(asked) == 1:
            verdicts = {channel: self._ask(user_id, external, channel, ns) for channel, ns in asked.items()}
        else:
            verdicts = self._ask_all(user_id, external, asked)
        for channel, verdict in verdicts.items():
            if verdict.outcome == "allowed":
                self._grant(client, channel, user_id, verdict)
        for channel, verdict in verdicts.items():
            if verdict.outcome == "forbidden":
                raise forbidden(f"You may not subscribe to {channel!r}.")
        for channel, verdict in verdicts.items():
            if verdict.outcome == "unavailable":
                raise unavailable(f"Whether you may subscribe to {channel!r} could not be asked; retry shortly.")

    def _ask_all(self, user_id: str, external: dict | None, asked: dict[str, Namespace]) -> dict[str, Verdict]:
        """Each channel asked in a greenlet of its own: the request waits for the slowest, one time-out at most."""
        asking = {channel: gevent.spawn(self._ask, user_id, external, channel, ns) for channel, ns in asked.items()}
        try:
            gevent.joinall(list(asking.values()))
        finally:
            gevent.killall([greenlet for greenlet in asking.values() if not greenlet.dead])
        found = {}
        for channel, greenlet in asking.items():
            if greenlet.exception is not None:
                raise greenlet.exception
            found[channel] = greenlet.value
        return found

    @staticmethod
    def _external(client, user_id: str) -> dict | None:
        """The user's identity at a trusted issuer (`{"issuer", "sub"}`), for a user made by a token exchange."""
        issuer, sub = client.hmget(Keys.user(user_id), ["external_issuer", "external_sub"])
        return {"issuer": issuer, "sub": sub} if issuer and sub else None

    def _ask(self, user_id: str, external: dict | None, channel: str, namespace: Namespace) -> Verdict:
        """One signed POST to the namespace's backend, and what its answer means."""
        if not (namespace.proxy_url and namespace.proxy_secret):  # stored otherwise by hand: nothing to ask
            log.warning("%s %s: no proxy_url or secret stored", PURPOSE, namespace.name)
            return Verdict("unavailable")
        asked = {"user_id": user_id, **({"external": external} if external else {}), "channel": channel}
        body = grants.compact(asked)
        message_id = f"msg_{secrets.token_hex(16)}"
        headers = {
            "Content-Type": "application/json",
            **signature_headers(message_id, body, [namespace.proxy_secret], time.time()),
        }
        reply = self.sender.request(
            namespace.name,
            "POST",
            namespace.proxy_url,
            body=body.encode(),
            headers=headers,
            timeout=self.timeout,
            read_limit=READ_LIMIT,
        )
        result = reply.result
        if result.kind in UNAVAILABLE_NO_CONNECTION:
            log.warning("%s %s: no answer about %s: %s", PURPOSE, namespace.name, channel, result.error)
            return Verdict("unavailable")
        if result.status_code != 200:
            log.warning("%s %s: refused %s: answered %s", PURPOSE, namespace.name, channel, result.error or "not 200")
            return Verdict("forbidden")
        return self._verdict(namespace.name, channel, reply.body)

    def _verdict(self, namespace: str, channel: str, body: bytes) -> Verdict:
        """A 200's body: `{"allow": true, "info"?, "expires_in"?}` allows; anything else refuses."""
        try:
            answer = parse_json(body)
        except StrictJSONError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("allow"), bool):
            log.warning('%s %s: refused %s: the answer is not {"allow": true|false}', PURPOSE, namespace, channel)
            return Verdict("forbidden")
        if answer["allow"] is False:
            return Verdict("forbidden")
        info, expires_in = answer.get("info"), answer.get("expires_in")
        if expires_in is None:
            expires_in = self.grant_seconds
        try:
            if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
                raise validation_failed("expires_in must be a number of seconds.")
            grants.check_grant(info, expires_in)
        except ApiError as refusal:
            log.warning("%s %s: refused %s: %s", PURPOSE, namespace, channel, refusal.message)
            return Verdict("forbidden")
        return Verdict("allowed", info, expires_in)

    def _grant(self, client, channel: str, user_id: str, verdict: Verdict) -> None:
        """Store the grant as a member's grant is stored, announce it and record it (its actor: the service)."""
        if not grants.grant(client, channel, user_id, verdict.info, verdict.expires_in):
            return  # the account is gone: the recheck that follows refuses the channel
        self.app.extensions["event_bus"].announce_access_changed("access_changed", channel=channel, user_id=user_id)
        details = {"channel": channel, "expires_in": verdict.expires_in, "source": "subscribe_proxy"}
        if has_app_context():
            audit.record("channel.member_added", subject=user_id, details=details, actor=dict(audit.SYSTEM))
        else:  # a parked WebSocket's frame is answered outside any request
            with self.app.app_context():
                audit.record("channel.member_added", subject=user_id, details=details, actor=dict(audit.SYSTEM))
