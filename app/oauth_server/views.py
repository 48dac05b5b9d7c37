"""`POST /oauth/token`: the token endpoint (Authlib's server, app/oauth_server/server.py), with every grant type:
RFC 8693's token exchange and the OpenID provider's authorization code, refresh token and client credentials.
Each grant is rate limited as it needs (throttle.py), none of the client grants per client address.

Every error it answers is in RFC 6749's shape, `{"error", "error_description"}`, with `Cache-Control:
no-store`: Authlib's own, and the service's (a refused cross-site request, the rate limit, a body too
large, Redis away), which are reshaped on the way out with the same code the rest of the service names.
"""

from __future__ import annotations

import json

from authlib.oauth2.rfc6749 import InvalidRequestError, OAuth2Error
from flask import Blueprint, current_app, request

from ..auth.views import TOKEN_COOKIES
from ..openapi import operation
from .schemas import TokenAnswer, TokenError, TokenRequest

bp = Blueprint("oauth_server", __name__)
FORM = "application/x-www-form-urlencoded"


@bp.post("/oauth/token")
@operation(
    "Token endpoint: a client's tokens (authorization code with PKCE, refresh token, client credentials), or RFC "
    "8693 token exchange of a trusted issuer's token for a session",
    tags=["openid"],
    form=TokenRequest,
    responses={200: TokenAnswer},
    errors=(400, 401, 403, 413, 429),
    error_answer=TokenError,
    headers={200: TOKEN_COOKIES, 401: {"WWW-Authenticate": "Basic, when client authentication failed."}},
)
def token():
    """Exchange a token (the grant decides; Authlib answers its errors)."""
    server = current_app.extensions["oauth_server"]
    try:
        if request.mimetype != FORM:
            raise InvalidRequestError(f"The token endpoint takes a form ({FORM}).")
        if not request.form.get("grant_type"):
            raise InvalidRequestError("The field grant_type is required.")
        return server.create_token_response()
    except OAuth2Error as error:  # raised before Authlib's own handling (e.g. a plain-HTTP request)
        return server.handle_error_response(None, error)


@bp.after_request
def errors_in_rfc6749_shape(response):
    """The service's own errors here (`{"error": {"code", "message"}}`) as RFC 6749's; never cached."""
    if response.status_code >= 400 and response.is_json:
        body = response.get_json(silent=True)
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            said = body["error"]
            response.set_data(json.dumps({"error": said.get("code"), "error_description": said.get("message")}))
    response.headers["Cache-Control"] = "no-store"
    response.headers["Pragma"] = "no-cache"
    return response
