"""Back-channel logout (OpenID Connect Back-Channel Logout 1.0): a client whose session ended is told so.

When a session that a client holds tokens in ends, by whatever way (logout, logout everywhere, a password change
or reset, an administrator, reuse detection, deleting the user, deleting the client, RP-initiated logout), a client
with a `backchannel_logout_uri` receives a `POST` of `logout_token=<JWT>` there. The message is queued where the
end is noticed and sent by the delivery process, retried and address-checked as outgoing webhooks are
(app/outgoing/backchannel.py).

- Which ended sessions were a client's: the user's client sessions (`Keys.client_sessions`, session id -> client
  id, written with the session). Every end of sessions sends `sessions_ended`; then each client session of the
  user whose record is gone is queued, and only then leaves the index, so an end noticed by no one (a process that
  died in between, an expiry) is queued at the user's next one. A message is made at most once per session.
- A deleted client: `client_deleted` keeps its last URI with its target (messages queued afterwards still reach
  it), finds its sessions through the users the client concerns (`Keys.client_users`, added before any session
  of it starts), queues their logouts and ends those still alive. Whichever receiver of the signal runs first,
  each session is told once.
- The logout token is signed at each attempt, not when queued: `iat` is the attempt's, `exp` two minutes later
  (a retry hours later is still a token the client accepts), and `jti` new each time (a client that rejects a
  `jti` it has seen still accepts the retry after an answer that was lost). `sid` and `sub` name the session;
  `aud` is the client id, as in its ID tokens; `typ` is `logout+jwt`. No `nonce`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import defaultdict
from urllib.parse import urlencode

import gevent
import redis
from flask import Flask, current_app

from ..auth.sessions import end_session, sessions_ended
from ..outgoing.backchannel import NotSendable, Outgoing, Targets
from ..redis import Keys, get_redis
from . import keys
from .clients import OAuthClient, client_deleted, get_client
from .issuer import issuer
from .sessions import client_sessions

log = logging.getLogger(__name__)

EVENT = "http://schemas.openid.net/event/backchannel-logout"
TOKEN_TYPE = "logout+jwt"  # noqa: S105 - a JWT type, not a secret
TOKEN_LIFETIME_SECONDS = 120
DELETION_WAIT_SECONDS = 3.0  # how long an attempt waits for a client's deletion to record its last URI
USERS_BATCH = 500  # users whose client sessions are read per round trip when a client is deleted


def _targets() -> Targets:
    return current_app.extensions["backchannel_targets"]


def notify_ended(user_id: str) -> int:
    """Queue a logout for each of the user's client sessions that has ended (its record is gone), then drop them
    from the index; how many messages were new."""
    held = client_sessions(user_id)
    if not held:
        return 0
    client = get_redis()
    pipe = client.pipeline(transaction=False)
    for session_id in held:
        pipe.exists(Keys.session(user_id, session_id))
    ended = [sid for sid, alive in zip(held, pipe.execute(), strict=True) if not alive]
    if not ended:
        return 0
    by_client: dict[str, list[str]] = defaultdict(list)
    for session_id in ended:
        by_client[held[session_id]].append(session_id)
    queued = sum(queue_logouts(user_id, client_id, session_ids) for client_id, session_ids in by_client.items())
    client.hdel(Keys.client_sessions(user_id), *ended)
    return queued


def queue_logouts(user_id: str, client_id: str, session_ids: list[str], client: OAuthClient | None = None) -> int:
    """Queue the logout of these sessions of one user with one client (nothing for a client that takes none).

    `client` is the client as it was when it is being deleted; otherwise it is read now, and a client gone
    already still gets its messages (its deletion keeps its last URI for them).
    """
    client = client or get_client(client_id)
    if client is not None and not client.backchannel_logout_uri:
        return 0
    items = [
        (session_id, json.dumps({"sub": user_id, "sid": session_id}, separators=(",", ":")))
        for session_id in session_ids
    ]
    return _targets().queue(client_id, items)


def sessions_of_client(client_id: str) -> dict[str, list[str]]:
    """The client sessions of one client, by user (user id -> session ids), of the users it concerns."""
    client = get_redis()
    user_ids = sorted(client.smembers(Keys.client_users(client_id)))
    found: dict[str, list[str]] = {}
    for start in range(0, len(user_ids), USERS_BATCH):
        chunk = user_ids[start : start + USERS_BATCH]
        pipe = client.pipeline(transaction=False)
        for user_id in chunk:
            pipe.hgetall(Keys.client_sessions(user_id))
        for user_id, held in zip(chunk, pipe.execute(), strict=True):
            owned = sorted(sid for sid, holder in held.items() if holder == client_id)
            if owned:
                found[user_id] = owned
    return found


def client_gone(client_id: str, client: OAuthClient) -> int:
    """A client was deleted: keep its last URI, queue the logout of every session it held, and end those still
    alive (each end's own notice then finds it queued already); how many messages were new."""
    _targets().mark_deleted(client_id, client.backchannel_logout_uri)
    queued = 0
    for user_id, session_ids in sessions_of_client(client_id).items():
        queued += queue_logouts(user_id, client_id, session_ids, client=client)
        for session_id in session_ids:
            end_session(user_id, session_id, "session.revoked")
        notify_ended(user_id)
    return queued


# ---- The delivery process: what an attempt sends ----


def logout_request(target: dict, message: dict) -> Outgoing | None:
    """The POST one attempt makes: a logout token signed now, to the URI the client has now (the last one it had,
    once deleted). None when the client takes no logouts any more; NotSendable for a failure worth a retry."""
    client_id = target["client_id"]
    client = get_client(client_id)
    url = client.backchannel_logout_uri if client is not None else _deleted_client_uri(client_id)
    if not url:
        return None
    named = json.loads(message["body"])
    now = int(time.time())
    claims = {
        "iss": issuer(),
        "aud": client_id,
        "iat": now,
        "exp": now + TOKEN_LIFETIME_SECONDS,
        "jti": secrets.token_urlsafe(16),
        "sub": named["sub"],
        "sid": named["sid"],
        "events": {EVENT: {}},
    }
    try:
        token = keys.sign(claims, typ=TOKEN_TYPE)
    except keys.SigningKeyUnreadable:
        raise NotSendable("no signing key can be opened with this process's SECRET_KEY") from None
    body = urlencode({"logout_token": token}).encode()
    return Outgoing(url, body, {"Content-Type": "application/x-www-form-urlencoded"})


def _deleted_client_uri(client_id: str) -> str | None:
    """The URI a deleted client had, as its deletion kept it; a deletion still under way is waited for a while."""
    deadline = time.monotonic() + DELETION_WAIT_SECONDS
    while True:
        target = _targets().record(client_id)
        if target.get("deleted_at"):
            return target.get("url") or None
        if time.monotonic() > deadline:
            raise NotSendable("the client is gone and its deletion has not recorded its last URI")
        gevent.sleep(0.1)


# ---- Signals ----


def init_app(app: Flask) -> None:
    """Notice every end of sessions and every deleted client; tell the delivery process what to send."""
    app.extensions["backchannel_logout_request"] = logout_request

    def on_sessions_ended(sender, user_id, session_ids=(), whole_user=False, **_):
        try:
            notify_ended(user_id)
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as error:
            # The sessions have ended; their index entries stay, so the user's next end of a session queues them.
            log.warning("back-channel logout: not queued for user %s now (%s); at their next end", user_id, error)

    def on_client_deleted(sender, client_id, client, **_):
        client_gone(client_id, client)

    sessions_ended.connect(on_sessions_ended, sender=app, weak=False)
    client_deleted.connect(on_client_deleted, sender=app, weak=False)
