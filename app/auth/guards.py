"""Who is calling (bearer or cookie), the CSRF rule for cookie-authenticated requests, and CORS.

CORS only decides which other origins may *read* responses; it does not stop a forged request from
being processed. That is the job of SameSite=Strict cookies plus the Origin check here (docs/security.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from flask import Flask, current_app, g, request

from ..errors import forbidden, unauthorized
from . import cookies, sessions, tokens

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
API_KEY_PREFIX = "ak_"


def sets_session_cookies(view):
    """Declare at a view that it sets session cookies without being cookie-authenticated (login,
    register, refresh): a cross-site page must not log a browser in either (login CSRF), so the
    Origin rule applies to it whatever the request carries."""
    view.sets_session_cookies = True
    return view


def csrf_exempt(view):
    """Declare at a view that the CSRF rule does not apply: it authenticates by a signature, not cookies."""
    view.csrf_exempt = True
    return view


def accepts_client_tokens(blueprint):
    """Declare at a blueprint that a client's access token with scope `events` (the OpenID provider's)
    authenticates its user at every view of it; every other view refuses such tokens (401)."""
    blueprint.accepts_client_tokens = True
    return blueprint


def _accepts_client_tokens() -> bool:
    blueprint = current_app.blueprints.get(request.blueprint) if request.blueprint else None
    return bool(getattr(blueprint, "accepts_client_tokens", False))


def _declared(marker: str) -> bool:
    view = current_app.view_functions.get(request.endpoint) if request.endpoint else None
    return bool(getattr(view, marker, False))


@dataclass(frozen=True)
class Caller:
    """Who is calling, as one verified access token and the stored user record say."""

    user_id: str
    role: str
    session_id: str
    token_version: int
    expires_at: int
    via: str  # "bearer" | "cookie"
    user: dict  # the user's public fields (`U` in docs/api.md) as verification found them
    client_id: str | None = None  # a client's access token (the OpenID provider's), acting for its user

    @property
    def is_admin(self) -> bool:
        """Whether the stored role (not the token's claim) is admin; never through a client's token: an
        application the user let read their events does not get an administrator's powers with it."""
        return self.role == "admin" and self.client_id is None


def bearer_token() -> str | None:
    """The token of an `Authorization: Bearer` header; None without one, 401 when malformed."""
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise unauthorized("The Authorization header must be 'Bearer <token>'.")
    return value.strip()


def _api_key(token: str):
    """The API key a bearer token names (one Redis round trip), or 401 when unknown or deleted."""
    key = current_app.extensions["api_key_verifier"](token)
    if key is None:
        raise unauthorized("The API key is not valid.")
    return key


def authenticate() -> Caller:
    """The verified user calling this request, or a 401 ApiError (403 for an API key: users only here)."""
    if "caller" in g:
        return g.caller
    token, via = bearer_token(), "bearer"
    if token is not None and token.startswith(API_KEY_PREFIX):
        _api_key(token)
        raise forbidden("This endpoint needs a user's access token; API keys cannot call it.")
    if token is None:
        token, via = request.cookies.get(cookies.ACCESS_COOKIE), "cookie"
    if not token:
        raise unauthorized()
    g.caller = verified_caller(token, via, client_tokens=_accepts_client_tokens())
    return g.caller


def verified_caller(token: str, via: str, client_tokens: bool = False) -> Caller:
    """The caller a user's access token names, once the token and its session are verified; else a 401 ApiError.

    With `client_tokens`, a client's access token with scope `events` sent as a bearer token stands for its user
    too (the events endpoints); the service's own tokens are tried first, and a client's never verifies as one.
    """
    return verified_caller_reading(token, via, [], client_tokens)[0]


def verified_caller_reading(token: str, via: str, reads: list, client_tokens: bool = False) -> tuple[Caller, list]:
    """`verified_caller`, with read commands sent in its session check's round trip where they can go together
    (`sessions.verify_session_reading`): the caller, and the reads' answers (none where they did not go)."""
    try:
        claims = tokens.decode_access_token(token)
    except tokens.TokenExpired:
        raise unauthorized("The access token has expired.", "token_expired") from None
    except tokens.TokenInvalid:
        if client_tokens and via == "bearer":
            return current_app.extensions["client_tokens"].events_caller(token), []
        raise unauthorized("The access token is not valid.") from None
    user, answers = sessions.verify_session_reading(claims.user_id, claims.session_id, claims.token_version, reads)
    if user is None:
        raise unauthorized("The session has ended; log in again.")
    # The stored role, not the token's: a demotion applies on the next request, not at token expiry.
    caller = Caller(claims.user_id, user["role"], claims.session_id, claims.token_version, claims.expires_at, via, user)
    return caller, answers


def login_required(view):
    """Decorate a view that needs a verified caller (401 otherwise)."""

    @functools.wraps(view)
    def wrapper(*args, **kwargs):
        authenticate()
        return view(*args, **kwargs)

    return wrapper


def authenticate_key(scope: str):
    """The API key calling this request, which must have `scope` (401 without a key, 403 without the scope)."""
    if "api_key" in g:
        return g.api_key
    token = bearer_token()
    if token is None or not token.startswith(API_KEY_PREFIX):
        raise unauthorized(f"This endpoint needs an API key with scope {scope}.")
    key = _api_key(token)
    if scope not in key.scopes:
        raise forbidden(f"This API key does not have the scope {scope}.")
    g.api_key = key
    return key


def api_key_required(scope: str):
    """Decorate a view that only backends call: an API key with `scope`."""

    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            authenticate_key(scope)
            return view(*args, **kwargs)

        return wrapper

    return decorate


def user_or_api_key(scope: str):
    """Decorate a view that users (access token) and API keys with `scope` may both call."""

    def decorate(view):
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            token = bearer_token()
            if token is not None and token.startswith(API_KEY_PREFIX):
                authenticate_key(scope)
            else:
                authenticate()
            return view(*args, **kwargs)

        return wrapper

    return decorate


def current_api_key():
    """The API key that `authenticate_key` verified for this request, if one did."""
    return g.get("api_key")


def current_caller() -> Caller:
    """The caller that `authenticate` verified for this request."""
    return g.caller


def own_origin() -> str:
    """The scheme and host the client used (after ProxyFix), as an Origin header would spell it."""
    return f"{request.scheme}://{request.host}".lower()


def _listed_origin(origin: str) -> bool:
    """Whether `origin` is one of ALLOWED_ORIGINS (case and a trailing slash aside)."""
    allowed = current_app.config["SETTINGS"].allowed_origins
    return origin.rstrip("/").lower() in {o.lower() for o in allowed}


def origin_allowed(origin: str) -> bool:
    """Our own origin or a listed one: may send cookie-authenticated requests."""
    return origin.rstrip("/").lower() == own_origin() or _listed_origin(origin)


def cross_site_request() -> bool:
    """True when the browser says this request comes from a foreign page."""
    origin = request.headers.get("Origin")
    if origin is not None:
        return not origin_allowed(origin)
    return request.headers.get("Sec-Fetch-Site") == "cross-site"


def _uses_cookies() -> bool:
    if "Authorization" in request.headers:
        return False
    has_cookie = cookies.ACCESS_COOKIE in request.cookies or cookies.REFRESH_COOKIE in request.cookies
    return has_cookie or _declared("sets_session_cookies")


def check_csrf() -> None:
    """Refuse (403) an unsafe, cookie-authenticated request that a foreign page started."""
    if request.method not in UNSAFE_METHODS or _declared("csrf_exempt"):
        return
    if _uses_cookies() and cross_site_request():
        raise forbidden("Cross-site request refused.", "csrf_rejected")


def _preflight_response():
    origin = request.headers.get("Origin", "")
    response = current_app.make_default_options_response()
    response.status_code = 204
    if origin and origin_allowed(origin):
        response.headers["Access-Control-Allow-Methods"] = "GET, POST, PUT, PATCH, DELETE"
        response.headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type, Last-Event-ID, X-Request-ID"
        response.headers["Access-Control-Max-Age"] = "600"
    return response


def cors_headers(origin: str | None) -> list[tuple[str, str]]:
    """What a response to a listed origin says to let its page read it; nothing for any other origin."""
    if not origin or not _listed_origin(origin):
        return []
    return [
        ("Access-Control-Allow-Origin", origin),
        ("Access-Control-Allow-Credentials", "true"),
        ("Access-Control-Expose-Headers", "Event-Cursor, Retry-After, X-Request-ID"),
    ]


def _add_cors_headers(response):
    for name, value in cors_headers(request.headers.get("Origin")):
        response.headers[name] = value
    response.vary.add("Origin")
    return response


def init_app(app: Flask) -> None:
    """Run the CSRF rule and answer CORS preflights before every view; add CORS headers after."""

    @app.before_request
    def guard_request():
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return _preflight_response()
        check_csrf()
        return None

    app.after_request(_add_cors_headers)
