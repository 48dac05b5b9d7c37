"""`GET /`: the browser page, and the security headers every answer carries."""

from __future__ import annotations

from flask import Blueprint, Flask, render_template, request

from .auth.oauth import provider_names
from .openapi import operation

bp = Blueprint("page", __name__)

# No inline script, style or data: images; connections only to this origin (WebSocket included); no
# framing. Pages on other origins that embed client.js are governed by their own policy, not this one.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
)


@bp.get("/")
@bp.get("/verify-email")
@bp.get("/reset-password")
@bp.get("/login-mfa")
@bp.get("/invitation")
@operation("The browser page", tags=["pages"], responses={200: ("text/html", "The page")})
def index():
    """The browser page: log in, watch events by any transport, manage devices, the account and organizations.

    Links in mails land on /verify-email and /reset-password, and an OAuth login that needs a second
    factor on /login-mfa, each with its token in the fragment; an invitation to an organization on
    /invitation with its token in the query. The page's script takes it from there (and clears it from
    the address bar); the server never reads it here.
    """
    response = render_template("index.html", providers=provider_names())
    return response, 200, {"Cache-Control": "no-store"}


SECURITY_HEADERS = [
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
]


def _security_headers(response):
    for name, value in SECURITY_HEADERS:
        response.headers.setdefault(name, value)
    if response.mimetype == "text/html" or request.endpoint == "static":
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    return response


def init_app(app: Flask) -> None:
    """Give every answer the security headers (the page and its scripts a strict CSP too)."""
    app.after_request(_security_headers)
