"""`GET /oauth/logout` (and `POST`, as RP-Initiated Logout 1.0 allows): a client sends its user here to log out.

- With a valid `id_token_hint` (one of this provider's ID tokens; an expired one still names its session) and a
  `post_logout_redirect_uri` registered for that client (exact string), the client session the token's `sid`
  names ends and the browser goes back to that URI with `state`. Only that session ends: the user stays signed in
  here and in other clients (a client cannot end more without the user saying so).
- Otherwise (no hint, no URI, or one that is not registered) the user is asked first, on a page of this service:
  `Log out` ends this browser's session here, with every client session authorized from it (and the hinted one),
  `Stay signed in` ends nothing. The browser goes back only to a registered URI; any other is never followed.
- Every session that ends tells its client by back-channel logout (app/oidc/backchannel.py).

The question's form is this service's own: it carries an anti-forgery value that must equal the one in a
`__Host-` cookie (SameSite=Strict) set with the page, so no other site can submit it, and the cross-site rule of
every cookie request applies too. The navigation from a client is cross-site, so the page never learns who the user
is from it (the session cookies are Strict); the form's same-site POST does (its script renews an expired access
cookie first, from the refresh cookie only /auth receives).
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from flask import Blueprint, render_template, request
from werkzeug.wrappers import Response

from ..auth import cookies, sessions
from ..auth.guards import authenticate
from ..errors import ApiError
from ..http import has_control_characters
from ..openapi import operation
from . import keys
from .clients import CLIENT_ID, OAuthClient, get_client
from .sessions import client_sessions

bp = Blueprint("oidc_logout", __name__)

FORM_COOKIE = "__Host-logout-form"  # the anti-forgery value's other half; Secure, Path=/, no Domain
FORM_FIELD = "form_token"
FORM_LIFETIME_SECONDS = 30 * 60
PARAMETER_LIMIT = 4096  # state, and a redirect URI
HINT_LIMIT = 16 * 1024
NO_STORE = {"Cache-Control": "no-store"}
PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; object-src 'none'; form-action 'self'"
)
REDIRECT_HEADERS = {302: {"Location": "The registered post_logout_redirect_uri, with state"}}


class Refused(Exception):
    """A logout request that cannot be acted on: answered by a page saying why, never by a redirect."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message, self.status = message, status


@dataclass(frozen=True)
class LogoutRequest:
    """What a client asked for, checked: the client, the session its hint names, where to send the browser."""

    client: OAuthClient | None
    hint: str | None  # the id_token_hint as given, when valid (the question's form carries it on)
    user_id: str | None  # the hint's sub
    session_id: str | None  # the hint's sid
    redirect_uri: str | None  # a registered post_logout_redirect_uri, or None
    state: str | None

    def form_fields(self) -> dict[str, str]:
        """What the question's form carries on to its answer."""
        fields = {
            "id_token_hint": self.hint,
            "client_id": self.client.client_id if self.client else None,
            "post_logout_redirect_uri": self.redirect_uri,
            "state": self.state,
        }
        return {name: value for name, value in fields.items() if value is not None}


@bp.get("/oauth/logout")
@operation(
    "RP-initiated logout: with a valid id_token_hint and a registered post_logout_redirect_uri, that client "
    "session ends and the browser goes back there with state; otherwise a page asks the user first "
    "(query: id_token_hint, post_logout_redirect_uri, client_id, state)",
    tags=["pages"],
    responses={
        200: ("text/html", "A page asking the user, or saying the client session has ended"),
        302: None,
        400: ("text/html", "A page saying why the request cannot be acted on"),
    },
    headers=REDIRECT_HEADERS,
)
def logout():
    """Act on a client's logout request (see the module docstring)."""
    return _asked(request.args)


@bp.post("/oauth/logout")
@operation(
    "RP-initiated logout by a form (as its GET), or the answer to the page's question (Log out / Stay signed in)",
    tags=["pages"],
    responses={
        200: ("text/html", "A page asking the user, or saying what ended"),
        302: None,
        400: ("text/html", "A page saying why the request cannot be acted on"),
        403: ("text/html", "A page saying the form was not this service's"),
    },
    headers=REDIRECT_HEADERS,
)
def logout_form():
    """A client's request sent as a form, or the user's answer to the question (it carries the form token)."""
    if FORM_FIELD not in request.form:
        return _asked(request.form)
    try:
        asked = _checked(request.form)
        _check_form_token(request.form.get(FORM_FIELD))
    except Refused as refused:
        return _page("invalid", status=refused.status, message=refused.message)
    if request.form.get("action") != "logout":
        return _back(asked) or _page("stayed", client=asked.client)
    ended_here = _end_browser_session()
    if asked.session_id:
        _end_client_session(asked)
    response = _back(asked) or _page("done", client=asked.client)
    if ended_here:
        cookies.clear_token_cookies(response)
    return response


def _asked(values) -> Response:
    """A client's request: done at once with a valid hint and a registered URI, else the question."""
    try:
        asked = _checked(values)
    except Refused as refused:
        return _page("invalid", status=refused.status, message=refused.message)
    if asked.session_id and asked.redirect_uri:
        _end_client_session(asked)
        return _back(asked)
    if asked.session_id and not values.get("post_logout_redirect_uri"):
        _end_client_session(asked)
        return _page("done", client=asked.client)
    return _question(asked)


def _checked(values) -> LogoutRequest:
    """The request's parameters checked; Refused for what must not be acted on."""
    hint = _text(values, "id_token_hint", HINT_LIMIT)
    client_id = _text(values, "client_id", PARAMETER_LIMIT)
    asked_uri = _text(values, "post_logout_redirect_uri", PARAMETER_LIMIT)
    state = _text(values, "state", PARAMETER_LIMIT)
    user_id = session_id = None
    if hint is not None:
        claims = _hint_claims(hint)
        audience = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if client_id is not None and client_id not in audience:
            raise Refused("The client_id is not the one the id_token_hint was issued to.")
        if client_id is None:
            if len(audience) != 1:
                raise Refused("The id_token_hint names several audiences; say which client with client_id.")
            client_id = audience[0]
        user_id, session_id = claims["sub"], claims["sid"]
    client = None
    if client_id is not None:
        client = get_client(client_id) if CLIENT_ID.fullmatch(client_id) else None
        if client is None:
            raise Refused("No such client.")
    redirect_uri = asked_uri if client is not None and asked_uri in client.post_logout_redirect_uris else None
    return LogoutRequest(client, hint, user_id, session_id, redirect_uri, state)


def _text(values, name: str, limit: int) -> str | None:
    """One parameter: absent or empty is None; too long, or with control characters, is refused."""
    value = values.get(name)
    if not value:
        return None
    if len(value) > limit or has_control_characters(value):
        raise Refused(f"The parameter {name} is not valid.")
    return value


def _hint_claims(hint: str) -> dict:
    """The claims of an ID token this provider issued (expired or not); Refused for anything else."""
    try:
        claims = keys.verify(hint, typ=None, verify_exp=False)
    except keys.TokenInvalid:
        raise Refused("The id_token_hint is not an ID token of this service.") from None
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    named = [claims.get("sub"), claims.get("sid")]
    if not audiences or not all(isinstance(value, str) and value for value in [*audiences, *named]):
        raise Refused("The id_token_hint does not name a client session.")
    return claims


def _end_client_session(asked: LogoutRequest) -> bool:
    """End the client session the hint names, if it is still that client's; False when it had ended already."""
    if client_sessions(asked.user_id).get(asked.session_id) != asked.client.client_id:
        return False
    return sessions.end_session(asked.user_id, asked.session_id, "logout")


def _end_browser_session() -> bool:
    """End the session of this browser (its access cookie), with the client sessions authorized from it."""
    try:
        caller = authenticate()
    except ApiError:
        return False  # no session here (or an API key, which is no browser): nothing of it to end
    if caller.via != "cookie":
        return False
    sessions.end_session(caller.user_id, caller.session_id, "logout")
    sessions.end_sessions_authorized_from(caller.user_id, caller.session_id)
    return True


def _back(asked: LogoutRequest) -> Response | None:
    """The redirect to the registered URI, with `state`; None without one."""
    if asked.redirect_uri is None:
        return None
    scheme, netloc, path, query, fragment = urlsplit(asked.redirect_uri)
    if asked.state is not None:
        query = urlencode([*parse_qsl(query, keep_blank_values=True), ("state", asked.state)])
    response = Response(status=302, headers={"Location": urlunsplit((scheme, netloc, path, query, fragment))})
    response.headers.update(NO_STORE)
    return response


def _question(asked: LogoutRequest) -> Response:
    """The page asking the user, with its form's anti-forgery value (also in a Strict cookie of its own)."""
    token = secrets.token_urlsafe(32)
    response = _page("confirm", client=asked.client, fields={**asked.form_fields(), FORM_FIELD: token})
    if asked.redirect_uri is not None:
        # The answer is redirected there: a form's redirect must be allowed by the page's form-action.
        response.headers["Content-Security-Policy"] = PAGE_POLICY + " " + _source(asked.redirect_uri)
    # Under the site's `no-referrer` a browser sends `Origin: null` with the form's POST, which the cross-site rule
    # refuses; `same-origin` names this origin to itself and still tells other sites nothing.
    response.headers["Referrer-Policy"] = "same-origin"
    response.set_cookie(
        FORM_COOKIE, token, max_age=FORM_LIFETIME_SECONDS, path="/", secure=True, httponly=True, samesite="Strict"
    )
    return response


def _check_form_token(given: str | None) -> None:
    """The form's value must be the one this browser's cookie holds (set with the page that asked)."""
    held = request.cookies.get(FORM_COOKIE)
    if not given or not held or not hmac.compare_digest(given.encode(), held.encode()):
        raise Refused("This form did not come from this service's page, or it has expired; start again.", 403)


def _source(uri: str) -> str:
    """The CSP source that allows a URI: its origin, or its scheme (a private-use scheme, an IPv6 literal)."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https") and parts.hostname and ":" not in parts.hostname:
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    return f"{parts.scheme}:"


def _page(kind: str, status: int = 200, **context) -> Response:
    """The logout page in one of its forms (confirm, done, stayed, invalid)."""
    body = render_template("logout.html", kind=kind, form_field=FORM_FIELD, **context)
    response = Response(body, status=status, mimetype="text/html")
    response.headers.update(NO_STORE)
    response.headers["Content-Security-Policy"] = PAGE_POLICY
    return response
