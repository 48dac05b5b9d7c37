"""Client sessions: an authorization a user gives a client is a session of this service (app/auth/sessions.py),
whose record names the client (`client_id`), the browser session it was authorized from (`authorized_from`) and
the scope granted. The user's index of client sessions (session id -> client id) is written in the step that
starts such a session, and outlives the sessions it names, so that whoever learns of ended sessions can tell
which were a client's.

The browser session is the one the service's page signed in (its access cookie): the authorization endpoint
reads who is signed in, since when and how from it. A client session starts when its code is redeemed; it is
refused (and ended at once if it had started) when the code was used twice, or when the browser session that
authorized it, or the client, is gone by then: logging out that browser, or deleting the client, ends every
client session it led to, also one that was starting while it happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from authlib.oauth2.rfc6749 import InvalidGrantError
from flask import request

from ..auth import cookies, sessions, users
from ..auth.guards import verified_caller
from ..errors import ApiError
from ..redis import Keys, get_redis
from . import codes
from .clients import OAuthClient, get_client


@dataclass(frozen=True)
class BrowserSession:
    """The user signed in on the service's page in this browser: who, in which session, since when and how."""

    user_id: str
    session_id: str
    user: dict  # U
    auth_time: float
    amr: tuple[str, ...]
    ip: str | None

    def get_user_id(self) -> str:
        """The user's id (Authlib's user model)."""
        return self.user_id


@dataclass(frozen=True)
class ClientSessionUser:
    """A user in a client session, as the token endpoint issues tokens for: the session, its new refresh token
    (given to the client only with scope offline_access), and what the ID token says of the sign-in."""

    user: dict  # U
    session_id: str
    refresh_token: str | None
    auth_time: float = 0.0
    amr: tuple[str, ...] = ()
    nonce: str | None = None

    @property
    def user_id(self) -> str:
        """The user's id."""
        return self.user["id"]

    def get_user_id(self) -> str:
        """The user's id (Authlib's user model)."""
        return self.user["id"]


@dataclass(frozen=True)
class RefreshCredential:
    """A refresh token presented at the token endpoint, with the client session it names (Authlib's token)."""

    raw: str
    user_id: str
    session_id: str
    client_id: str
    scope: str

    def check_client(self, client: OAuthClient) -> bool:
        """Whether the token was issued to this client: another client's refresh token is refused."""
        return client.client_id == self.client_id

    def get_scope(self) -> str:
        """The scope the session was granted."""
        return self.scope


def client_sessions(user_id: str) -> dict[str, str]:
    """The user's client sessions as the index has them: session id -> client id (ended ones included, until the
    index forgets them)."""
    return sessions.client_sessions(user_id)


def browser_session() -> BrowserSession | None:
    """The session of the user signed in on the page in this browser (its access cookie), or None."""
    token = request.cookies.get(cookies.ACCESS_COOKIE)
    if not token:
        return None
    try:
        caller = verified_caller(token, "cookie")
    except ApiError:
        return None
    record = sessions.session_record(caller.user_id, caller.session_id)
    if not record or record.get("client_id"):
        return None
    signed_in = float(record.get("authenticated_at") or record["created_at"])  # a trusted issuer's: when it came
    amr = tuple(record.get("amr", "").split())
    return BrowserSession(caller.user_id, caller.session_id, caller.user, signed_in, amr, request.remote_addr)


def start(code: codes.AuthorizationCode, client: OAuthClient) -> ClientSessionUser:
    """Redeem `code` (used once: a second use ends what the first started) and start its client session;
    invalid_grant when the code was used already, or the browser session, the user or the client is gone."""
    if not codes.take(code):
        raise InvalidGrantError("The code was used already; what it gave has been revoked.")
    user = users.get_user(code.user_id)
    if user is None or not sessions.session_exists(code.user_id, code.authorized_from):
        raise InvalidGrantError("The sign-in that authorized this code has ended.")
    get_redis().sadd(Keys.client_users(client.client_id), code.user_id)  # before: deleting the client finds it
    grant = sessions.ClientGrant(client.client_id, code.authorized_from, code.scope, code.auth_time, code.amr)
    login = {"method": "oidc", "client_id": client.client_id, "amr": list(code.amr)}
    issued = sessions.start_session(code.user_id, client.name, code.ip, login, client=grant, session_id=code.session_id)
    # Checked again now that the session exists: a second use, a logout of the browser session or the client's
    # deletion that came meanwhile found no session to end, so it ends here.
    gone = (
        codes.reused(code)
        or not sessions.session_exists(code.user_id, code.authorized_from)
        or get_client(client.client_id) is None
    )
    if gone:
        sessions.end_session(code.user_id, issued.session_id, "session.revoked")
        raise InvalidGrantError("The code was used again, or its sign-in or client has ended meanwhile.")
    public = users.public_user(user)
    return ClientSessionUser(public, issued.session_id, issued.refresh_token, code.auth_time, code.amr, code.nonce)


def refresh_credential(raw: str) -> RefreshCredential | None:
    """The client session a refresh token names (not checked for reuse yet: the rotation does that), or None when
    it names none (a browser session's token included)."""
    named = sessions.parse_refresh_token(raw) if isinstance(raw, str) else None
    if named is None:
        return None
    record = sessions.session_record(*named)
    if not record.get("client_id"):
        return None
    return RefreshCredential(raw, named[0], named[1], record["client_id"], record.get("scope", ""))


def rotate(credential: RefreshCredential) -> ClientSessionUser:
    """Rotate the client session's refresh token as every refresh does (a reused one ends the session);
    invalid_grant for a token that does not rotate."""
    rotation = sessions.rotate_refresh_token(credential.raw)
    if rotation.outcome == "reused":
        raise InvalidGrantError("This refresh token was used already; the session has been ended.")
    user = users.get_user(rotation.user_id) if rotation.outcome in ("rotated", "grace") else None
    if user is None:
        raise InvalidGrantError("The refresh token is not valid, or its session has ended.")
    sessions.keep_client_index(credential.user_id)
    return ClientSessionUser(users.public_user(user), credential.session_id, rotation.refresh_token)


def end_authorized_from(user_id: str, browser_session_id: str) -> list[str]:
    """The browser session logged out: end the client sessions authorized from it."""
    return sessions.end_sessions_authorized_from(user_id, browser_session_id)
